"""A DNS server on 127.0.0.1 for the tests (``security.dns_server`` points at it): it
answers A and AAAA queries from a table the test sets, NXDOMAIN for names it does not
know, and can change its answer after a number of queries (a name that resolves to a
public address when the API checks it and to loopback when a worker connects)."""

from __future__ import annotations

import ipaddress
import socket
import threading

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


class DnsStub:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        # name -> list of address lists: each A query takes the next until the last one
        self._answers: dict[str, list[list[str]]] = {}
        self.queries: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def set(self, name: str, *answers: list[str]) -> None:
        """``name`` answers ``answers[0]`` to its first A/AAAA pair of queries, then the
        next, the last one for good; no answers: NXDOMAIN."""
        with self._lock:
            self._answers[name.lower().rstrip(".")] = [list(a) for a in answers]

    def start(self) -> DnsStub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    def _lookup(self, name: str, rdtype: str) -> list[str] | None:
        with self._lock:
            self.queries.append((name, rdtype))
            steps = self._answers.get(name)
            if not steps:
                return None
            current = steps[0]
            # An A query moves the name on to its next answer (AAAA follows the same step).
            if rdtype == "AAAA" and len(steps) > 1:
                steps.pop(0)
            return current

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except (TimeoutError, OSError):
                continue
            query = dns.message.from_wire(data)
            reply = dns.message.make_response(query)
            reply.flags |= dns.flags.AA
            question = query.question[0]
            name = question.name.to_text().rstrip(".").lower()
            rdtype = dns.rdatatype.to_text(question.rdtype)
            found = self._lookup(name, rdtype)
            if found is None:
                reply.set_rcode(dns.rcode.NXDOMAIN)
            else:
                version = 4 if rdtype == "A" else 6
                ips = [a for a in found if ipaddress.ip_address(a).version == version]
                if ips:
                    reply.answer.append(
                        dns.rrset.from_text_list(question.name, 1, "IN", rdtype, ips)
                    )
            self.sock.sendto(reply.to_wire(), peer)
