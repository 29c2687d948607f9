"""An in-worker token bucket per key (e.g. per provenance): ``await acquire()`` before each
request keeps one process at or under ``qps`` with bursts up to ``burst``."""

from __future__ import annotations

import asyncio
import time


class TokenBucket:
    def __init__(self, qps: float, burst: int | None = None) -> None:
        if qps <= 0:
            raise ValueError("qps must be positive")
        self.qps = qps
        self.capacity = float(max(1, burst or 1))
        self.tokens = self.capacity
        self.updated = time.monotonic()
        self._lock = asyncio.Lock()

    def set_rate(self, qps: float, burst: int | None = None) -> None:
        self.qps = qps
        self.capacity = float(max(1, burst or 1))
        self.tokens = min(self.tokens, self.capacity)

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.qps)
                self.updated = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                await asyncio.sleep((1 - self.tokens) / self.qps)


_buckets: dict[str, TokenBucket] = {}


def bucket_for(key: str, qps: float, burst: int | None = None) -> TokenBucket:
    """The process-wide bucket for ``key`` (its rate follows the latest contract)."""
    bucket = _buckets.get(key)
    if bucket is None:
        bucket = _buckets[key] = TokenBucket(qps, burst)
    elif bucket.qps != qps or bucket.capacity != max(1, burst or 1):
        bucket.set_rate(qps, burst)
    return bucket
