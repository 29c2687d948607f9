"""The state a failed run keeps for POST /tasks/{id}/retry (artemis/retained.py)."""

from __future__ import annotations

from datetime import timedelta

from artemis.db import utcnow
from artemis.migrate import upgrade
from artemis.retained import TAKEN_BACKSTOP, Retained
from artemis.run_models import RunRef

RUN = RunRef(task_code="code", task_id="t1", workflow_id="artemis/code/t1", trace_id="0" * 32)


def _kept(tmp_path, retain_s: float) -> Retained:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    kept = Retained(url)
    kept.keep(RUN, "SINK_UNAVAILABLE", "down", {"a": 1}, retain_s)
    return kept


def test_kept_state_is_found_by_task_id_taken_once_and_released(tmp_path):
    kept = _kept(tmp_path, 3600)
    assert kept.key_of("t1") == "code/t1" and kept.key_of("t2") is None
    state = kept.load("code/t1")
    assert state is not None and state["state"] == {"a": 1}
    assert state["error_code"] == "SINK_UNAVAILABLE" and state["taken_at"] is None
    assert kept.take("code/t1") and not kept.take("code/t1")  # one retry at a time
    kept.release("code/t1")
    assert kept.take("code/t1")


def test_expired_state_goes_but_not_while_a_retry_runs_on_it(tmp_path):
    kept = _kept(tmp_path, 0.0)
    now = utcnow() + timedelta(seconds=1)
    assert kept.load("code/t1", now) is None  # past retain_failed_s: a retry gets 410
    assert kept.expired(now) == ["code/t1"] and kept.live_keys(now) == set()
    kept.keep(RUN, "SINK_UNAVAILABLE", "down", {}, 3600)
    assert kept.take("code/t1")
    later = utcnow() + timedelta(hours=80)  # past 72 h, the retried run still going
    assert kept.expired(later) == [] and kept.live_keys(later) == {"code/t1"}
    assert kept.expired(utcnow() + TAKEN_BACKSTOP + timedelta(hours=1)) == ["code/t1"]
    # failing again keeps it afresh (not taken)
    kept.keep(RUN, "SOURCE_UNAVAILABLE", "down", {}, 3600)
    assert kept.load("code/t1")["taken_at"] is None
    kept.drop("code/t1")
    assert kept.load("code/t1") is None
