"""Where a request's URL may lead, decided on the address a connection is made to.

A request names a host; the allow-list (``security.allowed_hosts``) says which names it
may name. DNS then turns the name into addresses, and it may answer differently by the
time a worker connects (rebinding). So every connection to a URL a request supplied is
checked on the address it actually goes to: an *internal* address (loopback, private,
link-local, shared, reserved, documentation, multicast — in any of its IPv6 wrappings) is
reached only when a literal IP or CIDR entry of the allow-list contains it; a host *name*
in the list never admits an internal answer. Public addresses pass.

The classification is an explicit list of ranges, not ``ipaddress.is_global``, whose
answers differ between Python patch levels and which does not look inside IPv4-mapped,
NAT64, 6to4 or Teredo addresses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Net = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4_INTERNAL = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # shared address space (carrier NAT; some clouds' metadata)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local (cloud metadata services)
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation
        "192.88.99.0/24",  # 6to4 relay anycast
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation
        "203.0.113.0/24",  # documentation
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the broadcast address
    )
)
_V6_INTERNAL = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "::/128",  # unspecified
        "::1/128",  # loopback
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard-only
        "2001::/23",  # IETF protocol assignments (Teredo's 2001::/32 is unwrapped first)
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation
        "5f00::/16",  # segment routing
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_COMPAT = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_TEREDO = ipaddress.IPv6Network("2001::/32")


def embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (IPv4-mapped, IPv4-compatible, NAT64, 6to4,
    Teredo's client), or None."""
    if ip in _MAPPED:
        return ip.ipv4_mapped
    if ip in _NAT64 or (ip in _COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _TEREDO and ip.teredo is not None:
        return ip.teredo[1]
    return None


def is_internal(ip: IP) -> bool:
    """Whether ``ip`` is not a public unicast address (see the module's ranges)."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_v4(ip)
        if inner is not None:
            return is_internal(inner)
        return any(ip in net for net in _V6_INTERNAL)
    return any(ip in net for net in _V4_INTERNAL)


def parse_ip(text: str) -> IP | None:
    """An IP literal (brackets and an IPv6 zone dropped), or None for a name."""
    try:
        return ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


@dataclass(frozen=True)
class Entry:
    """One allow-list entry: a name pattern (``host``, ``*.example.com``, ``*``) or an IP
    network (a literal IP is a /32 or /128), and the one port it allows (None: any)."""

    name: str | None
    net: Net | None
    port: int | None

    @classmethod
    def parse(cls, raw: str) -> Entry:
        text = raw.lower().strip()
        port: int | None = None
        if text.startswith("["):
            inner, _, rest = text[1:].partition("]")
            text = inner
            if rest.startswith(":") and rest[1:].isdigit():
                port = int(rest[1:])
        elif text.count(":") == 1:
            host, _, p = text.partition(":")
            if p.isdigit():
                text, port = host, int(p)
        try:
            return cls(None, ipaddress.ip_network(text, strict=False), port)
        except ValueError:
            return cls(text, None, port)

    def port_ok(self, port: int | None) -> bool:
        return self.port is None or port is None or self.port == port

    def contains(self, ip: IP) -> bool:
        if self.net is None:
            return False
        if ip.version == self.net.version and ip in self.net:
            return True
        inner = embedded_v4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
        return inner is not None and inner.version == self.net.version and inner in self.net


class AllowList:
    """``security.allowed_hosts`` read once: which names and addresses a request may
    reach."""

    def __init__(self, entries: list[str]) -> None:
        self.raw = list(entries)
        self.entries = [Entry.parse(e) for e in entries]

    def match(self, host: str, port: int | None = None) -> str | None:
        """How ``host`` may be named: "exact" (the name, or an IP in a listed network),
        "wildcard", or None."""
        host = host.lower().strip("[]")
        ip = parse_ip(host)
        how = None
        for e in self.entries:
            if not e.port_ok(port):
                continue
            if ip is not None and e.contains(ip):
                return "exact"
            if e.name is None:
                continue
            if e.name == host:
                return "exact"
            if e.name == "*" or (e.name.startswith("*.") and host.endswith(e.name[1:])):
                how = "wildcard"
        return how

    def admits(self, ip: IP, port: int | None = None) -> bool:
        """Whether a connection may go to ``ip``: any public address; an internal one only
        when a literal IP or CIDR entry (with its port, if it pins one) contains it."""
        if not is_internal(ip):
            return True
        return any(e.contains(ip) and e.port_ok(port) for e in self.entries)


class Unresolvable(Exception):
    """A name with no address (or no answer in time)."""


class AddressRefused(OSError):
    """A connection the allow-list does not admit. An OSError, so that an HTTP client's
    resolver step reports it like a failed lookup; never a transient failure."""


class Resolver:
    """Names to addresses: the system's resolver, or a DNS server of the operator's
    (``security.dns_server``, ``host:port``), asked directly for A and AAAA records."""

    def __init__(self, dns_server: str | None = None, timeout_s: float = 5.0) -> None:
        self.dns_server = dns_server
        self.timeout_s = timeout_s

    async def addresses(self, host: str) -> list[IP]:
        literal = parse_ip(host)
        if literal is not None:
            return [literal]
        try:
            found = await asyncio.wait_for(self._lookup(host), self.timeout_s)
        except (OSError, TimeoutError) as e:
            raise Unresolvable(f"{host!r} does not resolve ({type(e).__name__})") from None
        if not found:
            raise Unresolvable(f"{host!r} does not resolve (no address)")
        return found

    async def _lookup(self, host: str) -> list[IP]:
        if self.dns_server is None:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, None, type=socket.SOCK_STREAM
            )
            out: list[IP] = []
            for info in infos:
                ip = parse_ip(str(info[4][0]))
                if ip is not None and ip not in out:
                    out.append(ip)
            return out
        return await self._ask_server(host)

    async def _ask_server(self, host: str) -> list[IP]:
        import dns.asyncresolver
        import dns.exception
        import dns.resolver

        server, _, port = self.dns_server.rpartition(":") if self.dns_server else ("", "", "")
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [server.strip("[]")]
        resolver.port = int(port or 53)
        resolver.lifetime = self.timeout_s
        out: list[IP] = []
        for rdtype in ("A", "AAAA"):
            try:
                answer = await resolver.resolve(host, rdtype, search=False)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except dns.exception.DNSException as e:
                raise OSError(f"DNS: {type(e).__name__}") from None
            for record in answer:
                ip = parse_ip(record.to_text())
                if ip is not None:
                    out.append(ip)
        return out


async def admitted(host: str, port: int | None, allow: AllowList, resolver: Resolver) -> list[IP]:
    """The addresses of ``host`` a connection may go to (in the resolver's order).
    Raises Unresolvable (no address) or AddressRefused (only internal addresses that the
    allow-list does not name), each naming the host and, for the latter, the addresses."""
    addrs = await resolver.addresses(host)
    ok = [ip for ip in addrs if allow.admits(ip, port)]
    if not ok:
        shown = ", ".join(str(a) for a in addrs[:4])
        raise AddressRefused(
            f"{host!r} resolves to internal addresses only ({shown}): loopback, private, "
            "link-local and reserved addresses are reached only when a literal IP or CIDR "
            "entry of security.allowed_hosts contains them"
        )
    return ok
