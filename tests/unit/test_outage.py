"""What an outage is, how long a run waits between attempts, the words it shows, and the
waiting gauge (artemis/outage.py, artemis/metrics.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Answer, Headers, status_error
from artemis.metrics import WAITING, exposition
from artemis.outage import next_delay, outage_of, waiting_line
from artemis.transport_errors import ConnectError, ReadTimeout, transport_error


def _answer(status: int) -> Answer:
    return Answer(status, Headers({"Retry-After": "7"}), b"busy", "http://x/y")


def test_transient_answers_and_transport_failures_are_outages():
    for status in (500, 502, 503, 504, 408, 425, 429):
        o = outage_of(status_error(ErrorCode.SINK_ERROR, "post", _answer(status)), "sink", "http")
        assert o is not None and o.dependency == "sink" and o.name == "http"
        assert o.reason.startswith(str(status)) and o.retry_after_s == 7
    assert outage_of(
        status_error(ErrorCode.SINK_ERROR, "post", _answer(503)), "sink", "http"
    ).reason == ("503 Service Unavailable")
    refused = transport_error(
        ErrorCode.SOURCE_ERROR,
        "get",
        ConnectError("Connection refused", reason="connection refused"),
    )
    assert outage_of(refused, "source", "quotes").reason == "connection refused"
    timed_out = transport_error(ErrorCode.SOURCE_ERROR, "get", ReadTimeout("slow"))
    assert outage_of(timed_out, "source", "quotes").reason == "read timed out"


def test_permanent_failures_are_not_outages():
    for status in (400, 401, 403, 404, 409, 422):
        err = status_error(ErrorCode.SINK_ERROR, "post", _answer(status))
        assert outage_of(err, "sink", "http") is None
    assert outage_of(ArtemisError(ErrorCode.SOURCE_CONTRACT, "shape"), "source", "q") is None
    # an internal failure is a bug, not an outage, unless it names its dependency
    assert outage_of(ArtemisError(ErrorCode.INTERNAL, "boom"), "source", "q") is None
    store = ArtemisError(
        ErrorCode.INTERNAL,
        "staging store: database unavailable",
        details={"dependency": "store", "dependency_name": "staging", "reason": "x"},
    )
    o = outage_of(store, "source", "q")
    assert o is not None and (o.dependency, o.name) == ("store", "staging")
    assert outage_of(ValueError("no"), "source", "q") is None


def test_waits_back_off_to_the_cap_honour_retry_after_and_end_at_the_tolerance():
    delays = [next_delay(n, 1.0, 2.0, 60.0, None, 10_000) for n in range(1, 10)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert next_delay(1, 1.0, 2.0, 60.0, 30.0, 10_000) == 30  # Retry-After wins
    # never sleeps past the tolerance: one more attempt right at its end
    assert next_delay(9, 1.0, 2.0, 60.0, None, 5.0) == 5.05


def test_the_waiting_line():
    w = {
        "dependency": "sink",
        "name": "http",
        "since": "2026-11-26T12:03:04+00:00",
        "reason": "503 Service Unavailable",
        "attempt": 7,
        "next_in_s": 60,
        "next_attempt_at": "2026-11-26T12:10:00+00:00",
    }
    assert waiting_line(w) == (
        "waiting: sink http unavailable since 12:03:04 (503 Service Unavailable), "
        "attempt 7, next in 60 s"
    )
    now = datetime(2026, 11, 26, 12, 9, 30, tzinfo=UTC)
    assert waiting_line(w, now).endswith("attempt 7, next in 30 s")


def _gauge() -> dict[str, float]:
    out = {}
    for line in exposition()[0].decode().splitlines():
        if line.startswith("artemis_runs_waiting{"):
            dep = line.split('dependency="')[1].split('"')[0]
            out[dep] = float(line.rsplit(" ", 1)[1])
    return out


def test_the_waiting_gauge_counts_runs_by_dependency_and_forgets_recovered_ones():
    base = _gauge()
    WAITING.wait("unit/a", "sink", 5)
    WAITING.wait("unit/b", "sink", 5)
    WAITING.wait("unit/c", "source", 5)
    WAITING.wait("unit/a", "sink", 10)  # the same run's next attempt counts once
    now = _gauge()
    assert now["sink"] - base["sink"] == 2 and now["source"] - base["source"] == 1
    WAITING.wait("unit/a", "source", 5)  # one run waiting on two things counts in both
    assert _gauge()["source"] - base["source"] == 2
    WAITING.done("unit/a", "source")
    assert _gauge()["sink"] - base["sink"] == 2
    for key, dep in (("unit/a", "sink"), ("unit/b", "sink"), ("unit/c", "source")):
        WAITING.done(key, dep)
    assert _gauge() == base
    WAITING.wait("unit/d", "store", -100)  # its next attempt is long past: lapsed
    assert _gauge() == base
