"""Where a fetch attempt stands (``activities/fetch.py``): the source's checkpoint, the
next sequence number and the counts so far, what the last page said of the source (done,
its stated total, a unit ended short) and, for a fetch that streams its pages to the
run's sinks, its delivery ledger (``artemis/ledger.py``).

It is heartbeated after every page, so a retried attempt goes on from its predecessor's
last page; a streaming fetch also stages it with each page (the cursor), so a page sent
before its heartbeat reached Temporal keeps its sequence number. Typed here; plain JSON
only on those two wires, in one shape: the keys, their order and their values a retried
attempt reads back from a heartbeat or a cursor written by any worker, and what Temporal
records of an activity's heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from artemis.ledger import Ledger
from artemis.sources.base import PageInfo

# Where the fetch stands: on the wire from the attempt's start.
_POSITION_KEYS = ("checkpoint", "next_seq", "pages", "records", "units_done")
# What the last page said: on the wire once a page was taken.
_LAST_PAGE_KEYS = ("done", "expected_total", "incomplete")
# What a page moves, and what the staged cursor holds: all but the stream's.
_MOVED_KEYS = _POSITION_KEYS + _LAST_PAGE_KEYS
# Counts on the wire only once they are not 0: the wire keeps its shape for every fetch
# that has none (answers a response rule ignored).
_NONZERO_KEYS = ("responses_ignored",)


@dataclass
class FetchState:
    """A fetch attempt's resume state (see the module's docstring). ``stream``: set when
    the fetch streams its pages (``FetchInput.stream``)."""

    checkpoint: dict[str, Any] | None
    next_seq: int
    pages: int = 0
    records: int = 0
    units_done: int = 0
    stream: Ledger | None = None
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

    def after(self, checkpoint: dict[str, Any] | None, info: PageInfo, records: int) -> FetchState:
        """Where the fetch stands once a page is taken (the same stream): its checkpoint,
        what it said of the source and how many records it held."""
        return FetchState(
            checkpoint=checkpoint,
            next_seq=self.next_seq + 1,
            pages=self.pages + 1,
            records=self.records + records,
            units_done=self.units_done if info.units_done is None else info.units_done,
            stream=self.stream,
            done=checkpoint is None,
            expected_total=info.expected_total,
            incomplete=info.incomplete,
            page_taken=True,
            responses_ignored=self.responses_ignored + info.ignored,
            resources=info.resources if info.resources is not None else self.resources,
        )

    def take(self, checkpoint: dict[str, Any] | None, info: PageInfo, records: int) -> None:
        """Stand where ``after`` does (the stream's ledger is the stream's own)."""
        moved = self.after(checkpoint, info, records)
        for name in (*_MOVED_KEYS, *_NONZERO_KEYS, "page_taken", "resources"):
            setattr(self, name, getattr(moved, name))

    def to_json(self) -> dict[str, Any]:
        """The heartbeat's details."""
        out: dict[str, Any] = {name: getattr(self, name) for name in _POSITION_KEYS}
        if self.stream is not None:
            out["stream"] = self.stream.to_json()
        if self.page_taken:
            out.update((name, getattr(self, name)) for name in _LAST_PAGE_KEYS)
        out.update(self._counts())
        return out

    def _counts(self) -> dict[str, int]:
        out: dict[str, Any] = {
            name: getattr(self, name) for name in _NONZERO_KEYS if getattr(self, name)
        }
        if self.resources is not None:
            out["resources"] = self.resources
        return out

    def cursor(self, first_seq: int) -> dict[str, Any]:
        """What a streaming fetch stages with a page (``Staging.put_pages``): where it
        stands, and the batch it stands in."""
        return {
            **{name: getattr(self, name) for name in _MOVED_KEYS},
            **self._counts(),
            "first_seq": first_seq,
        }

    def resume(self, data: dict[str, Any]) -> None:
        """Go on from a heartbeat's details, or from a cursor staged with a page (without
        its ``first_seq``): what they hold replaces what this state holds."""
        for name in _MOVED_KEYS:
            if name in data:
                setattr(self, name, data[name])
        if isinstance(data.get("resources"), dict):
            self.resources = data["resources"]
        for name in _NONZERO_KEYS:
            if name in data:
                setattr(self, name, int(data[name] or 0))
        if any(name in data for name in _LAST_PAGE_KEYS):
            self.page_taken = True
        if "stream" in data:
            stream = data["stream"]
            self.stream = None if stream is None else Ledger.from_json(stream)
