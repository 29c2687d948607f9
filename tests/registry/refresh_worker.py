"""One harvesting worker of tests/registry/test_refresh_tokens.py, run as a process of its
own (its own token cache and locks, as a worker host has): it resolves a provenance's
contract from the shared database, says ``ready`` on stdout, waits for a line on stdin,
sends requests through a ``ContractClient`` on a few lanes at once for a while, and
writes what it saw (statuses, errors, every log event as structlog received it, before
any redaction) to a JSON file.

    python -m tests.registry.refresh_worker DB_URL KEY_FILE CODE SECONDS LANES OUT
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from structlog.testing import capture_logs

from artemis.config import HttpClientSettings, load_settings
from artemis.db import get_engine
from artemis.errors import ArtemisError
from artemis.http import make_client
from artemis.registry.client import ContractClient
from artemis.registry.resolve import resolve_contract


async def harvest(cc: ContractClient, seconds: float, lanes: int) -> dict[str, Any]:
    statuses: list[int] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    async def lane(n: int) -> None:
        page = 0
        while time.monotonic() < deadline:
            page += 1
            try:
                resp = await cc.send(
                    http, "GET", f"{cc.base}/items", {"lane": n, "page": page}, "GET items"
                )
                statuses.append(resp.status_code)
            except ArtemisError as e:
                errors.append(e.message)
            await asyncio.sleep(0.02)

    async with make_client(HttpClientSettings()) as http:
        await asyncio.gather(*(lane(n) for n in range(lanes)))
    return {"statuses": statuses, "errors": errors}


async def main(db_url: str, key_file: str, code: str, seconds: float, lanes: int) -> Any:
    settings = load_settings(None, database={"url": db_url}, vault={"master_key_file": key_file})
    with get_engine(db_url).connect() as conn:
        contract = resolve_contract(conn, code, "harvest")
    cc = ContractClient(contract, settings)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return await harvest(cc, seconds, lanes)


if __name__ == "__main__":
    db, key, prov, secs, n, out = sys.argv[1:7]
    with capture_logs() as logs:
        result = asyncio.run(main(db, key, prov, float(secs), int(n)))
    result["logs"] = [json.dumps(e, default=repr) for e in logs]
    with open(out, "w") as fh:
        json.dump(result, fh)
