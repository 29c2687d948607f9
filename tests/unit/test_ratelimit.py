"""The in-process token bucket of an operator's rate (POST /tasks/{id}/rate-limit)."""

from __future__ import annotations

import asyncio
import time

from artemis import ratelimit
from artemis.ratelimit import TokenBucket, bucket_for


async def _until_full(bucket: TokenBucket) -> None:
    """Wait (with a deadline) until ``bucket`` has been unused long enough to be full."""
    deadline = time.monotonic() + 5
    while not bucket.idle_full(time.monotonic()):
        assert time.monotonic() < deadline, "the bucket never filled up"
        await asyncio.sleep(0.005)


async def test_a_bucket_keeps_its_rate():
    bucket = TokenBucket(qps=20, burst=1)
    began = time.monotonic()
    for _ in range(5):
        await bucket.acquire()
    # one at once, then four at 20/s: at least 0.2 s (a busy machine only adds)
    assert time.monotonic() - began >= 0.19


async def test_buckets_of_runs_that_ended_are_dropped_and_a_live_one_is_kept():
    ratelimit._buckets.clear()
    ended = bucket_for("run:quotes/ended", qps=50)
    await ended.acquire()  # used once, then the run ended
    live = bucket_for("run:quotes/live", qps=50)
    # once the ended run's bucket is full again (1/50 s), the next lookup drops it
    await _until_full(ended)
    assert bucket_for("run:quotes/live", qps=50) is live
    assert set(ratelimit._buckets) == {"run:quotes/live"}
    # a thousand runs that came and went leave nothing behind
    for n in range(1000):
        last = bucket_for(f"run:quotes/{n}", qps=1000)
        await last.acquire()
    await _until_full(last)
    bucket_for("run:quotes/live", qps=50)
    assert set(ratelimit._buckets) == {"run:quotes/live"}
