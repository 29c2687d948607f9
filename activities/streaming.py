"""Emit while fetching: the pages of a fetch processed and sent to the run's sinks as they
are staged (``FetchInput.stream``), so the last page's emit, not the last batch's, is a
run's tail.

The guarantees are the batch path's: a page is staged before it is processed, processed
in order (the task's ``process`` sees the pages one after another), sent ``emit_concurrency``
pages at a time under its own idempotency key (run key, sink, sequence number), and
counted once it and every page before it are delivered — the counts live in the fetch's
heartbeat, so a retried attempt (a worker SIGKILLed mid-batch) sends again only the
pages above them, under the same keys. The first failure — a sink down, a record the
task cannot process — stops the stream: the pages from the gap on go through
process_batch and emit_batch, which wait out outages or fail the run; a
sink's refusal for good (a non-retryable error) fails the run with it, never sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from activities.run_base import log
from artemis.calls import work
from artemis.errors import ArtemisError, ErrorCode
from artemis.fetch_state import FetchState
from artemis.http import HttpClient
from artemis.ledger import Ledger, PageDone
from artemis.quarantine.pages import Judge, Outcome
from artemis.redact import redact_text
from artemis.run_models import RunRef
from artemis.sinks import EmitContext, Sink
from artemis.tasks import TaskContext, TaskUnit
from artemis.tracing import TraceContext

# The end of the pages (a sentinel on the queue).
_END = None


class PageStream:
    """One fetch's stream. ``state`` is the fetch's resume state: its ``stream`` (the
    stream's delivery ledger, ``artemis/ledger.py``) is kept there, so every heartbeat the
    fetch sends carries both where the fetch and where the stream stand."""

    def __init__(
        self,
        task: TaskUnit,
        ctx: TaskContext,
        client: HttpClient,
        sinks: list[Sink],
        run: RunRef,
        key: str,
        trace: TraceContext,
        state: FetchState,
        beat: Callable[[FetchState], None],
        judge: Judge,
        keep: Callable[[list[Outcome]], Awaitable[None]],
        report: Callable[[int, Outcome], Awaitable[None]],
    ) -> None:
        self.task, self.ctx, self.client, self.sinks = task, ctx, client, sinks
        self.judge, self.keep, self.report = judge, keep, report
        self.beat = beat
        self.run, self.key, self.trace = run, key, trace
        self.state = state
        assert state.stream is not None, "a fetch that streams has its stream's state"
        self.ledger: Ledger = state.stream
        # Set when a sink refused a page for good: the run fails with it, so the fetch
        # ends its batch at the next page instead of fetching what will not be sent.
        self.refused = asyncio.Event()
        self._queue: asyncio.Queue[tuple[int, list[dict[str, Any]]] | None] = asyncio.Queue()
        concurrency = task.emit_concurrency(ctx)
        self._gate = asyncio.Semaphore(concurrency)
        # Pages put and not yet sent (or skipped), at most: a sink slower than the source
        # slows the fetch down to its pace, and memory holds a few pages, not a batch.
        self._room = asyncio.Semaphore(max(8, 4 * concurrency))
        # Pages delivered above the ledger's gap (seq → the page, its judgement its note).
        self._above: dict[int, PageDone] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self._consumer = asyncio.create_task(self._consume())

    async def put(self, seq: int, records: list[dict[str, Any]]) -> None:
        """A staged page: the fetch goes on while it is processed and sent, unless the
        pages not yet sent fill the stream's room (then it waits for one to go)."""
        await self._room.acquire()
        self._queue.put_nowait((seq, records))

    async def close(self) -> Ledger:
        """Every page put is delivered (or the stream stopped): what it delivered."""
        self._queue.put_nowait(_END)
        await self._consumer
        while self._sending:
            await asyncio.gather(*list(self._sending))
        return Ledger.from_json(self.ledger.to_json())

    async def abort(self) -> None:
        """The fetch failed or was cancelled: nothing more is sent (what was delivered
        stays counted in the heartbeat)."""
        tasks = [self._consumer, *self._sending]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    def _stop(self, seq: int, error: BaseException) -> None:
        if self.ledger.stopped is not None:
            return
        code = error.code.value if isinstance(error, ArtemisError) else ErrorCode.INTERNAL.value
        self.ledger.stopped = code
        # The reason is logged here; the process/emit activities that take the rest over
        # meet it again and report it (wait, retry or fail) as the batch path does.
        log.info(
            "stream_stopped",
            seq=seq,
            delivered_below=self.ledger.next_seq,
            code=code,
            error=str(error)[:300],
        )

    async def _consume(self) -> None:
        """Pages in order through the task's ``process`` — the pages waiting together in
        one thread hop (a CPU-bound fetch queues several) — each then sent on its own."""
        ended = False
        while not ended:
            waiting = [await self._queue.get()]
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
            if waiting[-1] is _END:
                ended = True
                waiting.pop()
            pages = [page for page in waiting if page is not None]
            if not pages:
                continue
            if self.ledger.stopped is not None:
                for _ in pages:
                    self._room.release()
                continue
            done = await work(_judge_in_order, self.judge, pages)
            judged = [o for o in done if isinstance(o, Outcome)]
            if judged:
                try:  # their bad records kept (and the bound checked) before any is sent
                    await self.keep(judged)
                except Exception as e:  # process_batch meets it again
                    self._stop(judged[0].seq, e)
            for i, (seq, records) in enumerate(pages):
                # (pages after one that failed were not judged: the stream stopped)
                out = done[i] if i < len(done) else None
                if isinstance(out, BaseException):  # process_batch meets it again
                    self._stop(seq, out)
                if out is None or isinstance(out, BaseException) or self.ledger.stopped:
                    self._room.release()
                    continue
                await self._gate.acquire()
                if self.ledger.stopped is not None:
                    self._gate.release()
                    self._room.release()
                    continue
                sending = asyncio.create_task(self._send(seq, len(records), out))
                self._sending.add(sending)
                sending.add_done_callback(self._sending.discard)

    async def _send(self, seq: int, n_in: int, judged: Outcome) -> None:
        records = judged.records
        page = EmitContext(
            run_key=self.key,
            seq=seq,
            trace=self.trace,
            request_id=self.run.request_id,
            task_code=self.run.task_code,
            task_id=self.run.task_id,
        )
        try:
            if records:
                await self.task.emit(self.client, self.sinks, records, page)
        except Exception as e:  # emit_batch meets it again: waits it out, or fails
            self._room.release()
            if isinstance(e, ArtemisError) and not e.retryable and self.ledger.error is None:
                # Refused for good: sent again it would be refused again (or, worse, taken
                # although the error table says no retry). The run fails with it.
                self.ledger.error = {"code": e.code.value, "message": redact_text(e.message)}
                self.refused.set()
            self._stop(seq, e)
            return
        finally:
            self._gate.release()
        self._room.release()
        self._above[seq] = judged.done(n_in, page.counts)
        # (stopped: the page that failed is the gap; those above it go again, emit_batch)
        counted = self.ledger.count(self._above)
        self.beat(self.state)
        # A page's quarantine and drift are told where it is counted: a page above the
        # gap when the stream stops is judged and told again by process_batch, not twice.
        for at, done in counted:
            await self.report(at, done.note)


def _judge_in_order(
    judge: Judge, pages: list[tuple[int, list[dict[str, Any]]]]
) -> list[Outcome | BaseException]:
    """Each page judged (the task's ``process``, then the record model's check), up to the
    first that fails (its error in its place; the pages after it are not judged)."""
    out: list[Outcome | BaseException] = []
    for seq, records in pages:
        try:
            out.append(judge.page(seq, records))
        except Exception as e:
            out.append(e)
            break
    return out
