"""Prometheus metrics of Artemis (the process-wide default registry).

Each process exposes its own registry, the usual Prometheus model: the API on
``GET /metrics`` (with an embedded worker, as in ``artemis dev``, that includes the
worker's series), a separate worker process on ``metrics.worker_port``. The Temporal
SDK's own worker metrics (task slots, poll latencies, …) come from its runtime on
``metrics.sdk_port``.
"""

from __future__ import annotations

import threading
import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily

RUNS_STARTED = Counter("artemis_runs_started", "Task runs that started running", ["task_code"])
RUNS_FINISHED = Counter(
    "artemis_runs_finished", "Task runs that reached a terminal status", ["task_code", "status"]
)
RECORDS_FETCHED = Counter("artemis_records_fetched", "Records fetched from sources", ["task_code"])
RECORDS_EMITTED = Counter("artemis_records_emitted", "Records delivered to sinks", ["task_code"])
RECORDS_QUARANTINED = Counter(
    "artemis_records_quarantined", "Records set aside by the model check or process", ["task_code"]
)
SCHEMA_DRIFT = Counter(
    "artemis_schema_drift",
    "Fields a run saw a source add or stop sending (once per run and field)",
    ["task_code", "kind"],
)
PAGES_FETCHED = Counter("artemis_pages_fetched", "Pages fetched from sources", ["task_code"])
ACTIVITY_SECONDS = Histogram(
    "artemis_activity_duration_seconds",
    "Wall time of one activity attempt",
    ["activity", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
CALLBACKS = Counter(
    "artemis_callbacks", "CronJob callbacks by kind and outcome", ["kind", "outcome"]
)
RUN_REQUESTS = Counter(
    "artemis_run_requests", "POST /tasks/{code}/run answers", ["task_code", "outcome"]
)


class _Waiting:
    """``artemis_runs_waiting{dependency}``: runs waiting out an outage, by what they wait
    on (source, sink, store). A run's workflow reports each attempt and its recovery
    through this process's worker; an entry lapses two intervals after its next attempt
    was due, so a run that moved to another worker (or ended) is not counted twice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], float] = {}

    def wait(self, run_key: str, dependency: str, next_in_s: float) -> None:
        with self._lock:
            self._runs[(run_key, dependency)] = time.monotonic() + 2 * next_in_s + 30

    def done(self, run_key: str, dependency: str) -> None:
        with self._lock:
            self._runs.pop((run_key, dependency), None)

    def counts(self) -> dict[str, int]:
        now = time.monotonic()
        out = {"source": 0, "sink": 0, "store": 0}
        with self._lock:
            for (key, dependency), until in list(self._runs.items()):
                if until < now:
                    del self._runs[(key, dependency)]
                    continue
                out[dependency] = out.get(dependency, 0) + 1
        return out

    def collect(self):  # noqa: ANN201 (prometheus_client's collector protocol)
        family = GaugeMetricFamily(
            "artemis_runs_waiting",
            "Runs waiting out an outage of a dependency (source, sink, store)",
            labels=["dependency"],
        )
        for dependency, n in sorted(self.counts().items()):
            family.add_metric([dependency], n)
        yield family


WAITING = _Waiting()
REGISTRY.register(WAITING)  # type: ignore[arg-type]


def exposition() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST


_served: set[tuple[str, int]] = set()


def serve(host: str, port: int) -> None:
    """Serve this process's registry on ``host:port`` (once per address)."""
    if (host, port) not in _served:
        start_http_server(port, addr=host)
        _served.add((host, port))
