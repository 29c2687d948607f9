"""The live API against its own /openapi.json (schemathesis, every phase: examples,
coverage, fuzzing and stateful sequences over the OpenAPI links from the run route and
GET /tasks): no 5xx, no answer that does not match its documented schema or status."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from artemis.crawler.cookies import add_cookie
from artemis.crawler.vault import vault_for
from tests.conftest import new_task_id

TOKEN = "schemathesis-token-0123456789abcdef"


async def test_the_api_holds_to_its_openapi_contract(make_stack):
    # With role tokens, called as the CronJob's client token: the security scheme is
    # declared, its checks (ST401) prove that every guarded route refuses a request without
    # it or with a wrong one, and the stateful links follow the client's own task ids.
    stack = await make_stack(
        server={
            "api_tokens": [
                {"name": "cron", "token": TOKEN, "role": "client"},
                {"name": "ops", "token": "schemathesis-operator-0123456789", "role": "operator"},
            ]
        }
    )
    # a pooled cookie, so that a generated POST /notes/details can succeed
    vault = vault_for(stack.settings)
    add_cookie(vault, "sample", f"st-{new_task_id()}", "web_session=sample-st", 1)
    st = Path(sys.executable).parent / "st"
    cmd = [
        str(st),
        "run",
        f"{stack.api_url}/openapi.json",
        "--header",
        f"Authorization: Bearer {TOKEN}",
        "--checks",
        "all",
        # An opaque cursor or an unknown platform is rejected although its *type* is
        # valid: a 422 there is the contract, not a mismatch.
        "--exclude-checks",
        "positive_data_acceptance",
        "--max-examples",
        "10",
        "--generation-deterministic",
        "--request-timeout",
        "60",
    ]
    # In a thread: the API under test is served by this test's event loop.
    out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "Stateful" in out.stdout and "passed" in out.stdout
