"""A permanent failure is not an outage, through a real run: a registry source whose
certificate is self-signed (no CA bundle given) fails the run within seconds with
TLS_VERIFY_FAILED naming the check, where the outage tolerance (1800 s by default) would
have had it wait half an hour. Real API, worker and Temporal; a real HTTPS server on
127.0.0.1 with a certificate made at test time."""

from __future__ import annotations

import time

from tests.conftest import new_task_id
from tests.e2e.test_events import read_sse
from tests.e2e.test_literature import harvest_source, import_doc
from tests.registry.net import Server, json_ok, provenance, unique_code
from tests.unit.test_tls_failures import server_tls


async def test_a_self_signed_source_fails_the_run_at_once_naming_the_check(
    make_stack, tmp_path, monkeypatch
):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    # The default tolerance: an outage would be waited out for 30 minutes.
    stack = await make_stack(runs={"outage_tolerance_s": 1800})
    source = await Server({("GET", "/items"): json_ok}, tls=server_tls(tmp_path)).start()
    try:
        code = unique_code("tls_run")
        doc = provenance(code, source.url)
        doc["pagination_cfg"][0].update(records_jsonpath="$.items", short_page_is_last=True)
        import_doc(stack, doc)
        task_id = new_task_id()
        began = time.monotonic()
        resp = await harvest_source(stack, task_id, mode="async", provenance=code)
        assert resp.status_code == 202, resp.text
        final = await stack.wait_status(task_id, timeout=60)
        took = time.monotonic() - began
    finally:
        await source.stop()
    assert final["status"] == "failed", final
    error = final["error"]
    assert error["code"] == "TLS_VERIFY_FAILED", error
    assert "TLS certificate not trusted" in error["message"]
    assert "http_cfg.tls_ca_bundle_path" in error["message"]  # what to do about it
    assert took < 55, took  # an outage wait would last runs.outage_tolerance_s (1800 s)
    assert source.seen == []  # no request got past the handshake
    # Never shown as waiting on the source: not an outage.
    events = await read_sse(stack.api_url, task_id)
    assert not [e for e in events if e["event"] == "waiting"], events
