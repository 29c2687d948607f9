"""temporal.payload_encryption: every payload leaves the process encrypted; the starter's
codec endpoint gives operators (the Temporal UI) the clear text back."""

from __future__ import annotations

import base64
import uuid

import httpx
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowHistory

from artemis.config import Settings
from artemis.temporal.codec import ENCODING
from tests.conftest import new_task_id, serve_api, settings_with

# The events whose ``input`` or ``result`` payloads a run writes.
# The value looked for in clear in the history's raw bytes. Its "." is in no base64
# alphabet, so a Fernet token (base64url) cannot hold it by chance; a plain 4-letter value
# can (a fresh-clone run once found "ZZQX" in an encrypted history's bytes).
SECRET = "ZZQX.CLEAR"

PAYLOAD_EVENTS = (
    "workflow_execution_started_event_attributes",
    "activity_task_scheduled_event_attributes",
    "activity_task_completed_event_attributes",
    "marker_recorded_event_attributes",
    "workflow_execution_completed_event_attributes",
)


async def test_histories_hold_only_encrypted_payloads_and_the_codec_endpoint_decodes(
    base_settings,
):
    from artemis.temporal.client import connect
    from workers.main import running_worker

    settings = settings_with(
        base_settings,
        temporal={
            **base_settings.temporal.model_dump(),
            "payload_encryption": True,
            "task_queue": f"tq-{uuid.uuid4().hex[:10]}",
        },
    )
    client = await connect(settings)
    server, task, url = await serve_api(settings, client)
    try:
        async with running_worker(settings, client):
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                task_id = new_task_id()
                resp = await http.post(
                    "/tasks/pull_stock_quotes/run",
                    json={"meta": {"task_id": task_id}, "params": {"symbols": [SECRET]}},
                )
                data = resp.json()["data"]
                assert data["status"] == "completed", data
                history = await client.get_workflow_handle(data["workflow_id"]).fetch_history()
                nothing_in_clear(history, SECRET)
                first = history.events[0].workflow_execution_started_event_attributes.input
                await the_codec_endpoint_decodes_and_encodes(
                    http, first.payloads[0], SECRET, settings
                )
    finally:
        server.should_exit = True
        await task


def nothing_in_clear(history: WorkflowHistory, secret: str) -> None:
    """The raw bytes of every event, without the codec: ``secret`` (in the workflow
    input, activity inputs and results) is nowhere in clear; the only clear payloads are
    the search attributes the server indexes."""
    raw = b"".join(e.SerializeToString() for e in history.events)
    assert secret.encode() not in raw
    payloads = []
    for e in history.events:
        for attr in PAYLOAD_EVENTS:
            if e.HasField(attr):
                a = getattr(e, attr)
                for field in ("input", "result"):
                    if hasattr(a, field) and a.HasField(field):
                        payloads += list(getattr(a, field).payloads)
        if e.HasField("marker_recorded_event_attributes"):
            # a local activity's result (prepare, finalize, the task-store records)
            marker = e.marker_recorded_event_attributes
            if marker.marker_name == "core_local_activity" and "result" in marker.details:
                payloads += list(marker.details["result"].payloads)
    assert len(payloads) > 5
    assert {p.metadata["encoding"] for p in payloads} == {ENCODING}
    first = history.events[0].workflow_execution_started_event_attributes.input
    assert first.payloads[0].metadata["encoding"] == ENCODING


async def the_codec_endpoint_decodes_and_encodes(
    http: httpx.AsyncClient, payload: Payload, secret: str, settings: Settings
) -> None:
    """The codec endpoint (as the Temporal UI calls it) gives ``payload``'s clear JSON
    holding ``secret`` back and encrypts it again; it refuses a malformed body and lets
    the UI's origin call it (CORS)."""
    body = {
        "payloads": [
            {
                "metadata": {k: base64.b64encode(v).decode() for k, v in payload.metadata.items()},
                "data": base64.b64encode(payload.data).decode(),
            }
        ]
    }
    decoded = await http.post("/codec/decode", json=body, headers={"X-Namespace": "default"})
    assert decoded.status_code == 200, decoded.text
    clear = decoded.json()["payloads"][0]
    assert base64.b64decode(clear["metadata"]["encoding"]) == b"json/plain"
    assert secret in base64.b64decode(clear["data"]).decode()
    again = await http.post("/codec/encode", json=decoded.json())
    assert again.status_code == 200
    assert base64.b64decode(again.json()["payloads"][0]["metadata"]["encoding"]) == ENCODING
    bad = await http.post("/codec/decode", json={"payloads": "nope"})
    assert bad.status_code == 422
    preflight = await http.options(
        "/codec/decode",
        headers={"Origin": settings.temporal.ui_url, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.headers["access-control-allow-origin"] == settings.temporal.ui_url
