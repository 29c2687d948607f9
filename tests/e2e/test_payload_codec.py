"""temporal.payload_encryption: every payload leaves the process encrypted; the starter's
codec endpoint gives operators (the Temporal UI) the clear text back."""

from __future__ import annotations

import base64
import uuid

import httpx

from tests.conftest import new_task_id, serve_api, settings_with


async def test_histories_hold_only_encrypted_payloads_and_the_codec_endpoint_decodes(
    base_settings,
):
    from temporal_shared.client import connect
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
                    json={"meta": {"task_id": task_id}, "params": {"symbols": ["ZZQX"]}},
                )
                data = resp.json()["data"]
                assert data["status"] == "completed", data
                history = await client.get_workflow_handle(data["workflow_id"]).fetch_history()
                # The raw bytes of every event, without the codec: the symbol (in the
                # workflow input, activity inputs and results) is nowhere in clear; the
                # only clear payloads are the search attributes the server indexes.
                raw = b"".join(e.SerializeToString() for e in history.events)
                assert b"ZZQX" not in raw
                payloads = []
                for e in history.events:
                    for attr in (
                        "workflow_execution_started_event_attributes",
                        "activity_task_scheduled_event_attributes",
                        "activity_task_completed_event_attributes",
                        "marker_recorded_event_attributes",
                        "workflow_execution_completed_event_attributes",
                    ):
                        if e.HasField(attr):
                            a = getattr(e, attr)
                            for field in ("input", "result"):
                                if hasattr(a, field) and a.HasField(field):
                                    payloads += list(getattr(a, field).payloads)
                assert len(payloads) > 5
                assert {p.metadata["encoding"] for p in payloads} == {b"binary/encrypted"}
                first = history.events[0].workflow_execution_started_event_attributes.input
                assert first.payloads[0].metadata["encoding"] == b"binary/encrypted"
                body = {
                    "payloads": [
                        {
                            "metadata": {
                                k: base64.b64encode(v).decode()
                                for k, v in first.payloads[0].metadata.items()
                            },
                            "data": base64.b64encode(first.payloads[0].data).decode(),
                        }
                    ]
                }
                decoded = await http.post(
                    "/codec/decode", json=body, headers={"X-Namespace": "default"}
                )
                assert decoded.status_code == 200, decoded.text
                clear = decoded.json()["payloads"][0]
                assert base64.b64decode(clear["metadata"]["encoding"]) == b"json/plain"
                assert "ZZQX" in base64.b64decode(clear["data"]).decode()
                again = await http.post("/codec/encode", json=decoded.json())
                assert again.status_code == 200
                assert (
                    base64.b64decode(again.json()["payloads"][0]["metadata"]["encoding"])
                    == b"binary/encrypted"
                )
                bad = await http.post("/codec/decode", json={"payloads": "nope"})
                assert bad.status_code == 422
                preflight = await http.options(
                    "/codec/decode",
                    headers={
                        "Origin": settings.temporal.ui_url,
                        "Access-Control-Request-Method": "POST",
                    },
                )
                assert preflight.headers["access-control-allow-origin"] == settings.temporal.ui_url
    finally:
        server.should_exit = True
        await task
