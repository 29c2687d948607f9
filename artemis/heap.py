"""The garbage collector of a long-running process (the worker, the API), set once its
start-up is done.

Start-up leaves ~190,000 objects that live as long as the process (modules, settings,
clients, SQLAlchemy's tables, Temporal's worker). CPython's collector scans all of them at
every full (oldest-generation) collection: in the worker under `bench/accept.py`, one
every ~10 s of load, 90-140 ms each with the event loop held, and collections were 3 % of
the worker's CPU. Frozen (`gc.freeze`: moved to a permanent generation no collection
scans) and with the youngest generation collected every 7,000 allocations instead of 700,
they were 0.8 % and no collection took more than 31 ms (docs/performance.md).
Reference counting frees every object as usual; what the collector does is find cycles,
and a cycle waits up to 7,000 allocations longer to be found.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 7000


def settle_after_startup() -> int:
    """Collect what start-up left, freeze the rest, and collect the youngest generation
    less often; the number of objects frozen. Call once, from the process's entry point
    (not from code a test process runs many times: each call freezes what is alive)."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
    return gc.get_freeze_count()
