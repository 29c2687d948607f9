"""Where a fetch attempt stands (``activities/fetch.py``): the source's checkpoint, the
next sequence number and the counts so far, what the last page said of the source (done,
its stated total, a unit ended short) and, for a fetch that streams its pages to the
run's sinks, where that stream stands (the pages delivered without a gap, their counts);
and where an emit attempt stands (``EmitState``).

It is heartbeated after every page, so a retried attempt goes on from its predecessor's
last page; a streaming fetch also stages it with each page (the cursor), so a page sent
before its heartbeat reached Temporal keeps its sequence number. Typed here; plain JSON
only on those two wires, in one shape: the keys, their order and their values a retried
attempt reads back from a heartbeat or a cursor written by any worker, and what Temporal
records of an activity's heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from artemis.run_models import Streamed
from artemis.sources import Page


@dataclass
class StreamState:
    """What a fetch's stream delivered: every page below ``next_seq``, without a gap, and
    their counts (records taken in and sent out, per sink, the pages that sent any, the
    bad records kept and the fields a model dropped). ``stopped``: the error code that
    stopped it (the pages from the gap on go through process and emit); ``error``: a
    sink's refusal for good ({"code", "message"}: the run fails with it)."""

    next_seq: int
    records_in: int = 0
    records_out: int = 0
    records: int = 0
    batches: int = 0
    sinks: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None
    error: dict[str, Any] | None = None
    records_quarantined: int = 0
    fields_dropped: int = 0
    # Records the task's process left out on purpose: on the wire only once not 0 (the
    # wire keeps its shape for every stream that left none out).
    records_filtered: int = 0

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _STREAM}
        if self.records_filtered:
            out["records_filtered"] = self.records_filtered
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StreamState:
        return cls(
            next_seq=int(data["next_seq"]),
            records_in=int(data.get("records_in") or 0),
            records_out=int(data.get("records_out") or 0),
            records=int(data.get("records") or 0),
            batches=int(data.get("batches") or 0),
            sinks={str(k): int(v) for k, v in (data.get("sinks") or {}).items()},
            stopped=data.get("stopped"),
            error=data.get("error"),
            records_quarantined=int(data.get("records_quarantined") or 0),
            fields_dropped=int(data.get("fields_dropped") or 0),
            records_filtered=int(data.get("records_filtered") or 0),
        )

    def streamed(self) -> Streamed:
        """What the stream delivered, as the fetch's result tells it."""
        return Streamed(
            next_seq=self.next_seq,
            records_in=self.records_in,
            records_out=self.records_out,
            records_emitted=self.records,
            batches=self.batches,
            sinks=dict(self.sinks),
            stopped=self.stopped,
            error=self.error,
            records_quarantined=self.records_quarantined,
            fields_dropped=self.fields_dropped,
            records_filtered=self.records_filtered,
        )


_STREAM = tuple(n for n in StreamState.__dataclass_fields__ if n != "records_filtered")
# Where the fetch stands: on the wire from the attempt's start.
_PLACE = ("checkpoint", "next_seq", "pages", "records", "units_done")
# What the last page said: on the wire once a page was taken.
_SAID = ("done", "expected_total", "incomplete")
# What a page moves, and what the staged cursor holds: all but the stream's.
_AT = _PLACE + _SAID
# Counts on the wire only once they are not 0: the wire keeps its shape for every fetch
# that has none (answers a response rule ignored).
_COUNTS = ("responses_ignored",)


@dataclass
class FetchState:
    """A fetch attempt's resume state (see the module's docstring). ``stream``: set when
    the fetch streams its pages (``FetchInput.stream``)."""

    checkpoint: dict[str, Any] | None
    next_seq: int
    pages: int = 0
    records: int = 0
    units_done: int = 0
    stream: StreamState | None = None
    # The source is done (the last page had no checkpoint).
    done: bool = False
    # What the sources stated they hold, so far (None: no source states a total).
    expected_total: int | None = None
    # A unit ended short of its stated total beyond the tolerance (its description).
    incomplete: dict[str, Any] | None = None
    # A page was taken (or the state read back had been): the fields a page sets go on
    # the wire from then on (a heartbeat before the first page carries only the rest).
    page_taken: bool = False
    # Answers a response rule ignored (``PageInfo.ignored``), in this batch so far.
    responses_ignored: int = 0
    # A source of several resources: each resource's counts so far (the last page's
    # ``PageInfo.resources``; a handful of resources, never a list that grows).
    resources: dict[str, Any] | None = None

    def after(self, page: Page) -> FetchState:
        """Where the fetch stands once ``page`` is taken (the same stream)."""
        info = page.info
        return FetchState(
            checkpoint=page.checkpoint,
            next_seq=self.next_seq + 1,
            pages=self.pages + 1,
            records=self.records + len(page.records),
            units_done=self.units_done if info.units_done is None else info.units_done,
            stream=self.stream,
            done=page.checkpoint is None,
            expected_total=info.expected_total,
            incomplete=info.incomplete,
            page_taken=True,
            responses_ignored=self.responses_ignored + info.ignored,
            resources=info.resources if info.resources is not None else self.resources,
        )

    def take(self, page: Page) -> None:
        """Stand where ``after(page)`` does (the stream's state is the stream's own)."""
        moved = self.after(page)
        for name in (*_AT, *_COUNTS, "page_taken", "resources"):
            setattr(self, name, getattr(moved, name))

    def to_json(self) -> dict[str, Any]:
        """The heartbeat's details."""
        out: dict[str, Any] = {name: getattr(self, name) for name in _PLACE}
        if self.stream is not None:
            out["stream"] = self.stream.to_json()
        if self.page_taken:
            out.update((name, getattr(self, name)) for name in _SAID)
        out.update(self._counts())
        return out

    def _counts(self) -> dict[str, int]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _COUNTS if getattr(self, name)}
        if self.resources is not None:
            out["resources"] = self.resources
        return out

    def cursor(self, first_seq: int) -> dict[str, Any]:
        """What a streaming fetch stages with a page (``Staging.put_pages``): where it
        stands, and the batch it stands in."""
        return {
            **{name: getattr(self, name) for name in _AT},
            **self._counts(),
            "first_seq": first_seq,
        }

    def resume(self, data: dict[str, Any]) -> None:
        """Go on from a heartbeat's details, or from a cursor staged with a page (without
        its ``first_seq``): what they hold replaces what this state holds."""
        for name in _AT:
            if name in data:
                setattr(self, name, data[name])
        if isinstance(data.get("resources"), dict):
            self.resources = data["resources"]
        for name in _COUNTS:
            if name in data:
                setattr(self, name, int(data[name] or 0))
        if any(name in data for name in _SAID):
            self.page_taken = True
        if "stream" in data:
            stream = data["stream"]
            self.stream = None if stream is None else StreamState.from_json(stream)


@dataclass
class EmitState:
    """Where an emit attempt (``activities/batches.py``) stands: every page below
    ``next_seq`` delivered without a gap, and their counts (records, the pages that sent
    any, per sink). Heartbeated as it moves, so a retried attempt sends only the pages
    from there on; plain JSON only on that wire, in the shape a retry reads back."""

    next_seq: int
    records: int = 0
    batches: int = 0
    sinks: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "next_seq": self.next_seq,
            "records": self.records,
            "batches": self.batches,
            "sinks": dict(self.sinks),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EmitState:
        return cls(
            next_seq=int(data["next_seq"]),
            records=int(data.get("records") or 0),
            batches=int(data.get("batches") or 0),
            sinks={str(k): int(v) for k, v in (data.get("sinks") or {}).items()},
        )

    def count(self, delivered: dict[int, tuple[int, dict[str, int]]]) -> None:
        """Count the delivered pages that no longer leave a gap below them (taken out of
        ``delivered``; one above a gap waits there for the pages below it)."""
        while self.next_seq in delivered:
            n, counts = delivered.pop(self.next_seq)
            self.records += n
            self.batches += 1 if n else 0
            for name, taken in counts.items():
                self.sinks[name] = self.sinks.get(name, 0) + taken
            self.next_seq += 1
