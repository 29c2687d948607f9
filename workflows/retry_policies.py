"""Every retry policy of a task run, in one place.

Temporal retries an activity by its policy; the run's own waits (outages, the circuit
breaker's cool-down) are timers in the workflow, not policies. A failure no retry can
fix is an ``ErrorCode`` whose table entry says so (``artemis.errors``): the list below is
derived from it, never written out.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from artemis.errors import ErrorCode
    from artemis.run_models import FINALIZE_MAX_ATTEMPTS, RunTuning
    from artemis.run_state import CircuitBreaker, FetchRetry

# Error codes no retry can fix (docs/api.md); the activity boundary marks them
# non-retryable too.
NON_RETRYABLE = tuple(code.value for code in ErrorCode if not code.retryable)

# The CronJob protocol: the first try and 3 retries after 0.5 s, 1 s and 2 s (network
# errors and 5xx only; a 4xx answer is not retried by the activity itself).
FINALIZE = RetryPolicy(
    initial_interval=timedelta(seconds=0.5),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=2),
    maximum_attempts=FINALIZE_MAX_ATTEMPTS,
)
PREPARE = RetryPolicy(maximum_attempts=3, non_retryable_error_types=NON_RETRYABLE)
# Task-store writes: a few small writes, retried briefly (the run never waits on them).
MIRROR = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
)
OUTAGE_NOTE = RetryPolicy(maximum_attempts=2)
# Dropping a run's staged data, keeping a failed run's state: cheap, and worth a while.
HOUSEKEEPING = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
)


def process(tuning: RunTuning) -> RetryPolicy:
    """Rides out a database outage of several seconds (1 + 2 + 4 + 8 s by default):
    three quick attempts failed a run whose staging store was down for 6 s."""
    return RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=tuning.activity_max_attempts,
        non_retryable_error_types=NON_RETRYABLE,
    )


def emit(tuning: RunTuning) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(seconds=0.5),
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=tuning.activity_max_attempts,
        non_retryable_error_types=NON_RETRYABLE,
    )


def fetch(own: FetchRetry | None, circuit: CircuitBreaker | None, tuning: RunTuning) -> RetryPolicy:
    """A provenance's own retry cfg where it has one (with a circuit breaker, its
    threshold ends the attempts of one fetch), else the run's defaults."""
    if own is None:
        return process(tuning)
    attempts = own.maximum_attempts
    if circuit is not None:
        attempts = min(attempts, circuit.threshold)
    return RetryPolicy(
        initial_interval=timedelta(seconds=own.initial_s),
        backoff_coefficient=own.backoff,
        maximum_interval=timedelta(seconds=own.maximum_s),
        maximum_attempts=attempts,
        non_retryable_error_types=NON_RETRYABLE,
    )


# The housekeeping loops' passes (workflows/cleanup.py, reclaim.py, alerts.py): a pass
# that keeps failing is retried a few times, then the next pass comes on the loop's timer.
CLEANUP_PASS = RetryPolicy(maximum_attempts=3)
RECLAIM_PASS = RetryPolicy(maximum_attempts=3)
ALERTS_PASS = RetryPolicy(maximum_attempts=2)
# A note's details (workflows/note_details.py): one try — the batch answers within its
# time, a failed item says so (PARTIAL_FAIL), the caller may ask again.
NOTE_DETAIL = RetryPolicy(maximum_attempts=1)
# A replay of quarantined records: a sink down is retried for about ten minutes (the
# rows sent go again under their own keys), a refusal for good ends it.
REPLAY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=15,
    non_retryable_error_types=NON_RETRYABLE,
)
