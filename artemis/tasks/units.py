"""A run's independent units (the sources of ``build_sources``: the symbols of a quote
run, say) fetched concurrently, as one stream of pages with one resumable checkpoint.

Up to ``concurrency`` sources fetch at once; their pages reach the caller in the order
they arrive. Each source reads at most one page ahead: its next request starts when the
caller takes its page, so memory stays bounded and a source that breaks its contract is
asked at most once more. The checkpoint that comes with each page records, per unit,
where it resumes — only for pages already handed to the caller — so a retried fetch
resumes every unfinished unit where it stopped and fetches again at most the pages that
were in flight::

    {"v": 2, "done": [0, 2], "open": {"1": <source checkpoint>}, "expected": 1200}

``done``: the units finished; ``open``: those started, with the checkpoint after their
last page handed over; ``expected``: the totals the finished units stated. Units in
neither start from the beginning. A checkpoint without ``"v"`` (``{"source": i,
"state": …, "expected": …}``, one source after another) is read as well.

When a unit that stated a total ends short of it beyond the tolerance, its last page
carries ``info.incomplete`` and the stream ends there (the run fails INCOMPLETE once
that page is counted and emitted).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast

from artemis.completeness import shortfall
from artemis.http import HttpClient
from artemis.sources import Page, PageInfo, Source


@dataclass
class UnitsCheckpoint:
    done: set[int] = field(default_factory=set)
    open: dict[int, Any] = field(default_factory=dict)
    expected: int | None = None

    @classmethod
    def load(cls, raw: dict[str, Any] | None) -> UnitsCheckpoint:
        if not raw:
            return cls()
        if raw.get("v") == 2:
            return cls(
                done={int(i) for i in raw.get("done") or []},
                open={int(i): s for i, s in (raw.get("open") or {}).items()},
                expected=raw.get("expected"),
            )
        # One source after another (no "v"): the ones before ``source`` are done.
        index, state = int(raw.get("source", 0)), raw.get("state")
        return cls(
            done=set(range(index)),
            open={index: state} if state is not None else {},
            expected=raw.get("expected"),
        )

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": 2,
            "done": sorted(self.done),
            "open": {str(i): s for i, s in sorted(self.open.items())},
        }
        if self.expected is not None:
            out["expected"] = self.expected
        return out


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


@dataclass
class _Units:
    """What the unit workers share: the units left to fetch, the page budget and the
    queue their pages reach the consumer by."""

    sources: Sequence[Source]
    client: HttpClient
    cp: UnitsCheckpoint
    todo: list[int]
    queue: asyncio.Queue[Any]
    running: int
    # Requests left under ``max_pages`` (-1: no limit).
    budget: int
    resumed: bool
    wind_down: asyncio.Event | None

    def may_request(self) -> bool:
        """One more request may start (and is counted against ``max_pages``)."""
        if _set(self.wind_down) or self.budget == 0:
            return False
        self.budget -= 1
        return True

    async def work(self) -> None:
        """Fetch units one after another until none is left, the budget is spent or the
        run winds down; the last worker to finish ends the stream."""
        try:
            while self.todo and not _set(self.wind_down) and self.budget != 0:
                i = self.todo.pop(0)
                state = self.cp.open.get(i)
                if state is not None:
                    self.sources[i].resumed = self.resumed
                gen = cast(AsyncGenerator[Page, None], self.sources[i].pages(self.client, state))
                async with aclosing(gen) as pages:
                    while self.may_request():
                        page = await anext(pages, None)
                        if page is None:
                            break
                        taken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                        await self.queue.put((i, page, taken))
                        if page.checkpoint is None:
                            break
                        # One page ahead at most: the next request starts once this page
                        # is taken (it overlaps the caller's work on it, no more).
                        await taken
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # handed to the consumer, which raises it
            await self.queue.put(_Failed(e))
            return
        self.running -= 1
        if self.running == 0:
            await self.queue.put(_END)


async def fetch_units(
    sources: Sequence[Source],
    client: HttpClient,
    checkpoint: dict[str, Any] | None,
    *,
    concurrency: int,
    tolerance: float,
    resumed: bool = False,
    wind_down: asyncio.Event | None = None,
    max_pages: int | None = None,
) -> AsyncIterator[Page]:
    """Yield the pages of every unit, ``concurrency`` units at a time (see the module).

    The stream ends with a page whose checkpoint is None once every unit is done (a
    run with nothing left gets one empty such page). It ends earlier — its last page's
    checkpoint resuming every unit — when ``max_pages`` pages were requested, or once
    ``wind_down`` is set: no new request starts then, and the pages in flight still
    come."""
    cp = UnitsCheckpoint.load(checkpoint)
    todo = [i for i in range(len(sources)) if i not in cp.done]
    # Started units first: they hold what a crashed attempt had begun.
    todo.sort(key=lambda i: (i not in cp.open, i))
    stated: dict[int, int] = {}
    units = _Units(
        sources,
        client,
        cp,
        todo,
        queue=asyncio.Queue(maxsize=max(1, concurrency)),
        running=max(1, min(concurrency, len(todo))),
        budget=max_pages if max_pages is not None else -1,
        resumed=resumed,
        wind_down=wind_down,
    )
    if not todo:
        yield Page(records=[], checkpoint=None, info=PageInfo(units_done=len(cp.done)))
        return
    workers = [asyncio.create_task(units.work()) for _ in range(units.running)]
    try:
        while True:
            item = await units.queue.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            i, page, taken = item
            taken.set_result(None)
            ended_short = _settle(cp, stated, i, page, sources[i].name, tolerance, len(sources))
            yield page
            if ended_short:
                return
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


def _settle(
    cp: UnitsCheckpoint,
    stated: dict[int, int],
    i: int,
    page: Page,
    name: str,
    tolerance: float,
    units: int,
) -> bool:
    """Record unit ``i``'s page in the checkpoint and the totals, and fill in its info and
    the checkpoint it carries. True when the unit ended short of its stated total beyond
    the tolerance: the page then carries ``info.incomplete`` and the stream ends with it."""
    said = page.info.expected_total
    if page.checkpoint is not None:
        cp.open[i] = page.checkpoint
        if isinstance(said, int):
            stated[i] = said
    else:
        cp.open.pop(i, None)
        stated.pop(i, None)
        short = shortfall(
            name,
            said,
            page.info.taken,
            tolerance,
            page.info.request or "its last page",
        )
        if short is not None:
            page.info.incomplete = short
            page.info.expected_total = _sum(_add(cp.expected, said), stated)
            page.info.units_done = len(cp.done)
            page.info.source = name
            return True
        cp.done.add(i)
        cp.expected = _add(cp.expected, said)
    page.info.units_done = len(cp.done)
    page.info.expected_total = _sum(cp.expected, stated)
    page.info.source = name
    page.checkpoint = None if len(cp.done) == units else cp.dump()
    return False


def _set(event: asyncio.Event | None) -> bool:
    return event is not None and event.is_set()


def _add(a: int | None, b: Any) -> int | None:
    if not isinstance(b, int):
        return a
    return b if a is None else a + b


def _sum(base: int | None, open_units: dict[int, int]) -> int | None:
    total = base
    for v in open_units.values():
        total = _add(total, v)
    return total
