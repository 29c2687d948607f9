"""The three crawler alerts (docs/operations.md): each fires once per episode and
resolves, delivered to a real webhook receiver (the sample server) with a frozen clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import delete

from artemis.config import load_settings
from artemis.crawler.alerts import evaluate, record_outcome, webhook_sender
from artemis.crawler.claims import Claims
from artemis.crawler.cookies import add_cookie
from artemis.crawler.models import Candidate
from artemis.crawler.vault import CookieVault

T0 = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)


def test_each_alert_fires_once_and_resolves(crawl_db, samples):
    http = httpx.Client(base_url=samples.url)
    http.post("/_control/reset", json={})
    settings = load_settings(
        None,
        crawler={"platforms": {"xhs": {"base_url": f"{samples.url}/platform"}}},
        alerts={"webhook_url": f"{samples.url}/alerts/webhook", "backlog_threshold": 5},
    )
    send = webhook_sender(settings.alerts.webhook_url)

    def step(at: datetime) -> set[str]:
        return {f"{m['status']}:{m['alert']}" for m in evaluate(crawl_db, settings, at, send)}

    # P0: no cookie at all -> fires at once, once.
    assert step(T0) == {"firing:cookie_exhausted"}
    assert step(T0 + timedelta(minutes=1)) == set()
    vault = CookieVault(crawl_db, b"k" * 40)
    add_cookie(vault, "xhs", "a", "web_session=sample-alert")
    assert step(T0 + timedelta(minutes=2)) == {"resolved:cookie_exhausted"}

    # P1: 8 of 12 detail fetches ok in the window.
    for n in range(12):
        record_outcome(
            crawl_db, "xhs", n < 8, None if n < 8 else "TIMEOUT_ERROR", T0 + timedelta(minutes=3)
        )
    assert step(T0 + timedelta(minutes=4)) == {"firing:success_rate_low"}
    assert step(T0 + timedelta(minutes=5)) == set()
    # The window moves past the failures: resolved.
    assert step(T0 + timedelta(minutes=14)) == {"resolved:success_rate_low"}

    # P2: 6 pending > 5, but only after 30 minutes of it.
    Claims(crawl_db).add_candidates("xhs", [{"note_id": f"b{i}"} for i in range(6)])
    assert step(T0 + timedelta(minutes=20)) == set()
    assert step(T0 + timedelta(minutes=49)) == set()
    assert step(T0 + timedelta(minutes=50)) == {"firing:backlog"}
    assert step(T0 + timedelta(minutes=51)) == set()
    with crawl_db.begin() as conn:
        conn.execute(delete(Candidate.__table__))
    assert step(T0 + timedelta(minutes=52)) == {"resolved:backlog"}

    received = http.get("/_alerts").json()
    assert [(m["alert"], m["status"]) for m in received] == [
        ("cookie_exhausted", "firing"),
        ("cookie_exhausted", "resolved"),
        ("success_rate_low", "firing"),
        ("success_rate_low", "resolved"),
        ("backlog", "firing"),
        ("backlog", "resolved"),
    ]
    assert received[0]["severity"] == "P0" and received[4]["severity"] == "P2"
    assert received[2]["value"] == round(8 / 12, 4)


def test_an_undelivered_alert_is_sent_at_the_next_evaluation_not_twice(crawl_db, samples):
    http = httpx.Client(base_url=samples.url)
    http.post("/_control/reset", json={})
    settings = load_settings(
        None,
        crawler={"platforms": {"q": {"base_url": f"{samples.url}/platform"}}},
        alerts={"webhook_url": f"{samples.url}/alerts/webhook"},
    )
    send = webhook_sender(settings.alerts.webhook_url)
    http.post("/_control/alerts", json={"status": 503, "times": 1})
    assert evaluate(crawl_db, settings, T0, send) == []  # the webhook failed: not delivered
    sent = evaluate(crawl_db, settings, T0 + timedelta(minutes=1), send)
    assert [m["status"] for m in sent if m["alert"] == "cookie_exhausted"] == ["firing"]
    assert evaluate(crawl_db, settings, T0 + timedelta(minutes=2), send) == []
    assert [m["alert"] for m in http.get("/_alerts").json()] == ["cookie_exhausted"]
