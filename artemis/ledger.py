"""The delivery ledger: which staged pages of a range were judged (the task's process and
the record model's check) and delivered to the run's sinks, and what they counted.

One type for every path a page takes (docs/architecture.md, "The delivery ledger"):

- a fetch that streams its pages (``activities/fetch.py``) judges and delivers each;
- ``process_batch`` judges a staged batch; ``emit_batch`` delivers it
  (``activities/batches.py``).

Pages finish out of order (a handful go to the sinks at once): a page finished above a
gap waits in its path's ``above`` until the pages below it finish, and only
``Ledger.count`` moves ``next_seq`` and the counts, so every page below ``next_seq`` is
finished and counted once, without a gap. A retried attempt reads the ledger back from
its heartbeat and goes on from ``next_seq``: a page above it is sent again under the
same idempotency key and counted then, never twice. The workflow adds a ledger to the
run's counts (``RunState.count``) instead of counting pages itself.

Plain JSON on the heartbeat wire, one shape for both paths (``to_json``/``from_json``);
counts and sink names only, never a record (the ledger is workflow-side: it travels in
activity results).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PageDone:
    """One page finished by a path: its judgement's counts (when the path judges) and the
    records each sink took (when it delivers)."""

    records_in: int = 0
    records_out: int = 0
    quarantined: int = 0
    dropped: int = 0
    filtered: int = 0
    # Records sent to the sinks (0: a page with none, or one an earlier call delivered).
    sent: int = 0
    sinks: dict[str, int] = field(default_factory=dict)


@dataclass
class Ledger:
    """The pages ``[first_seq, next_seq)`` of a range, each judged (``judges``) and/or
    delivered (``delivers``), and their counts. ``stopped``: the error code that stopped a
    streaming path short of its range (the pages from ``next_seq`` on go through
    process_batch and emit_batch); ``error``: a sink's refusal for good
    ({"code", "message"}: the run fails with it, the page never sent again)."""

    first_seq: int
    next_seq: int
    judges: bool = True
    delivers: bool = True
    # What the judged pages took in, let through, set aside, dropped and filtered.
    records_in: int = 0
    records_out: int = 0
    records_quarantined: int = 0
    fields_dropped: int = 0
    records_filtered: int = 0
    # What the delivered pages sent: records, the pages that sent any, per sink.
    records_emitted: int = 0
    batches: int = 0
    sinks: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None
    error: dict[str, Any] | None = None

    @classmethod
    def starting(cls, first_seq: int, *, judges: bool, delivers: bool) -> Ledger:
        """A ledger of a range nothing of which is finished yet."""
        return cls(first_seq, first_seq, judges=judges, delivers=delivers)

    def count(self, above: dict[int, PageDone]) -> list[tuple[int, PageDone]]:
        """Count the finished pages that no longer leave a gap below them: taken out of
        ``above`` (one above a gap waits there for the pages below it) and returned."""
        counted: list[tuple[int, PageDone]] = []
        while self.next_seq in above:
            page = above.pop(self.next_seq)
            self._add(page)
            counted.append((self.next_seq, page))
            self.next_seq += 1
        return counted

    def with_above(self, above: dict[int, PageDone]) -> Ledger:
        """This ledger's counts and those of the pages finished above its gap (a sink
        went down mid-range: everything this call delivered counts now, once), standing
        where this one stands."""
        out = Ledger.from_json(self.to_json())
        for page in above.values():
            out._add(page)
        return out

    def _add(self, page: PageDone) -> None:
        if self.judges:
            self.records_in += page.records_in
            self.records_out += page.records_out
            self.records_quarantined += page.quarantined
            self.fields_dropped += page.dropped
            self.records_filtered += page.filtered
        if self.delivers:
            self.records_emitted += page.sent
            self.batches += 1 if page.sent else 0
            for name, taken in page.sinks.items():
                self.sinks[name] = self.sinks.get(name, 0) + taken

    def to_json(self) -> dict[str, Any]:
        """The heartbeat's shape (every key, always)."""
        return {name: getattr(self, name) for name in _WIRE} | {"sinks": dict(self.sinks)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ledger:
        ints = {name: int(data.get(name) or 0) for name in _COUNTS}
        return cls(
            first_seq=int(data["first_seq"]),
            next_seq=int(data["next_seq"]),
            judges=bool(data.get("judges", True)),
            delivers=bool(data.get("delivers", True)),
            sinks={str(k): int(v) for k, v in (data.get("sinks") or {}).items()},
            stopped=data.get("stopped"),
            error=data.get("error"),
            **ints,
        )


_COUNTS = (
    "records_in",
    "records_out",
    "records_quarantined",
    "fields_dropped",
    "records_filtered",
    "records_emitted",
    "batches",
)
_WIRE = tuple(Ledger.__dataclass_fields__)
