"""One FastAPI app with the quote API, a recording sink receiver and a recording CronJob.

Failures can be injected over HTTP (``POST /_control/{quotes|sink|cronjob}``) and what was
received read back (``GET /_sink/batches``, ``GET /_cronjob/calls``), so tests and the demo
talk to a real server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from datetime import date, timedelta
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


class Faults:
    """Injected failures of one endpoint, set by ``POST /_control/{target}``:

    - ``{"status": 503, "times": N}``: the next N requests answer ``status`` (with
      ``retry_after`` as a Retry-After header, after ``delay_ms`` when given);
    - ``{"status": 503, "for_s": S}``: every request answers ``status`` for S seconds
      from now (an outage: a deploy, a maintenance window); ``times`` is then ignored;
    - ``{"hang": true, "for_s": S}``: a request is accepted and answered nothing until
      the window ends (then answered normally): a client's read timeout must cut it;
    - ``{"trickle_s": T, "for_s": S}``: the answer's headers come at once, its body one
      byte every T seconds (a per-read timeout above T never fires);
    - ``{}``: no fault. ``GET /_control/{target}`` tells what is set."""

    def __init__(self) -> None:
        self.set({})

    def set(self, spec: dict[str, Any]) -> None:
        self.status: int | None = spec.get("status")
        self.times = int(spec.get("times", 1 if self.status else 0))
        self.delay_ms = int(spec.get("delay_ms", 0))
        self.retry_after: str | None = spec.get("retry_after")
        for_s = spec.get("for_s")
        self.until: float | None = time.monotonic() + float(for_s) if for_s else None
        self.hang = bool(spec.get("hang"))
        self.trickle_s = float(spec.get("trickle_s") or 0)

    def window_open(self) -> bool:
        return self.until is not None and time.monotonic() < self.until

    def describe(self) -> dict[str, Any]:
        left = max(0.0, self.until - time.monotonic()) if self.until is not None else None
        return {
            "status": self.status,
            "times": self.times,
            "hang": self.hang,
            "trickle_s": self.trickle_s,
            "active": self.window_open() or bool(self.status and self.times > 0),
            "seconds_left": left,
        }

    async def maybe_fail(self) -> JSONResponse | None:
        if self.delay_ms:
            await asyncio.sleep(self.delay_ms / 1000)
        if self.until is not None:
            if self.hang and self.window_open():
                await asyncio.sleep(max(0.0, self.until - time.monotonic()))
                return None
            if self.status and self.window_open():
                return self._answer()
            return None
        if self.status and self.times > 0:
            self.times -= 1
            return self._answer()
        return None

    def _answer(self) -> JSONResponse:
        headers = {"Retry-After": self.retry_after} if self.retry_after else None
        return JSONResponse(
            {"error": "injected failure"}, status_code=int(self.status or 500), headers=headers
        )

    def trickled(self, payload: dict[str, Any]) -> Response | None:
        """The answer dribbled out a byte at a time, while a trickle window is open."""
        if not (self.trickle_s and self.window_open()):
            return None
        body = json.dumps(payload).encode()
        pause = self.trickle_s

        async def drip() -> AsyncIterator[bytes]:
            for i in range(len(body)):
                yield body[i : i + 1]
                await asyncio.sleep(pause)

        return StreamingResponse(drip(), media_type="application/json")


def quote_for(symbol: str, day: date) -> dict[str, Any]:
    """A deterministic quote: the same (symbol, day) always gives the same numbers."""
    h = int.from_bytes(hashlib.sha256(f"{symbol}:{day}".encode()).digest()[:8], "big")
    base = 50 + (h % 5000) / 10
    spread = 1 + (h >> 20) % 50 / 10
    open_ = round(base, 2)
    close = round(base + ((h >> 8) % 200 - 100) / 100, 2)
    return {
        "symbol": symbol,
        "date": day.isoformat(),
        "open": open_,
        "high": round(max(open_, close) + spread, 2),
        "low": round(min(open_, close) - spread, 2),
        "close": close,
        "volume": 100_000 + h % 9_000_000,
    }


def create_app(latency_ms: float = 0.0) -> FastAPI:
    app = FastAPI(title="Artemis sample servers", docs_url=None, redoc_url=None)
    state: dict[str, Any] = {
        "latency_ms": latency_ms,
        "faults": {"quotes": Faults(), "sink": Faults(), "cronjob": Faults(), "alerts": Faults()},
        "alerts": [],
        "sink": [],
        "cronjob": [],
        "quote_requests": 0,
        "quote_calls": [],
    }
    app.state.samples = state
    from artemis.samples.literature import LiteratureState, build_router

    literature = LiteratureState()
    app.state.literature = literature
    app.include_router(build_router(literature))
    from artemis.samples import platform

    notes = platform.PlatformState()
    app.state.platform = notes
    app.include_router(platform.build_router(notes))

    # -- control ---------------------------------------------------------------------
    @app.post("/_control/{target}")
    async def control(target: str, request: Request) -> Any:
        spec = await request.json()
        if target == "latency":
            state["latency_ms"] = float(spec.get("latency_ms", 0))
        elif target == "reset":
            literature.configure({"reset": True})
            notes.reset()
            state["sink"].clear()
            state["cronjob"].clear()
            state["alerts"].clear()
            state["quote_requests"] = 0
            state["quote_calls"].clear()
            for f in state["faults"].values():
                f.set({})
        elif target in state["faults"]:
            state["faults"][target].set(spec)
        else:
            return JSONResponse({"error": f"unknown target {target!r}"}, status_code=404)
        return {"ok": True}

    @app.get("/_control/{target}")
    async def control_state(target: str) -> Any:
        if target not in state["faults"]:
            return JSONResponse({"error": f"unknown target {target!r}"}, status_code=404)
        return state["faults"][target].describe()

    # -- quotes ------------------------------------------------------------------------
    @app.get("/quotes")
    async def quotes(
        symbol: str, start: str, end: str, page: int = 1, page_size: int = 50
    ) -> JSONResponse:
        state["quote_requests"] += 1
        state["quote_calls"].append({"symbol": symbol, "page": page, "at": time.time()})
        if state["latency_ms"]:
            await asyncio.sleep(state["latency_ms"] / 1000)
        failed = await state["faults"]["quotes"].maybe_fail()
        if failed:
            return failed
        try:
            d0, d1 = date.fromisoformat(start), date.fromisoformat(end)
        except ValueError:
            return JSONResponse(
                {"error": f"bad date: start={start!r} end={end!r}, expected YYYY-MM-DD"},
                status_code=400,
            )
        if d1 < d0:
            return JSONResponse({"error": "end is before start"}, status_code=400)
        if page < 1 or not 1 <= page_size <= 1000:
            return JSONResponse(
                {"error": "page must be >= 1 and page_size in 1..1000"}, status_code=400
            )
        days = (d1 - d0).days + 1
        first = (page - 1) * page_size
        items = [
            quote_for(symbol.upper(), d0 + timedelta(days=i))
            for i in range(first, min(first + page_size, days))
        ]
        last = first + page_size >= days
        answer = {
            "symbol": symbol.upper(),
            "items": items,
            "page": page,
            "next_page": None if last else page + 1,
        }
        return state["faults"]["quotes"].trickled(answer) or JSONResponse(answer)

    # -- sink receiver -----------------------------------------------------------------------
    @app.post("/sink")
    @app.post("/sink/{name}")
    async def sink(request: Request, name: str = "default") -> JSONResponse:
        failed = await state["faults"]["sink"].maybe_fail()
        body = await request.body()
        entry = {
            "name": name,
            "received_at": time.time(),
            "idempotency_key": request.headers.get("idempotency-key"),
            "traceparent": request.headers.get("traceparent"),
            "request_id": request.headers.get("x-request-id"),
            "status": failed.status_code if failed else 200,
        }
        if failed:
            state["sink"].append({**entry, "records": None})
            return failed
        try:
            records = __import__("json").loads(body)
        except ValueError:
            return JSONResponse({"error": "body is not JSON"}, status_code=400)
        if not isinstance(records, list):
            return JSONResponse({"error": "body must be a JSON array"}, status_code=400)
        state["sink"].append({**entry, "records": records})
        return JSONResponse({"accepted": len(records)})

    @app.get("/_sink/batches")
    async def sink_batches() -> list[dict[str, Any]]:
        return state["sink"]

    # -- CronJob receiver --------------------------------------------------------------------
    @app.post("/cronjob/runs/{run_id}/{kind}")
    async def cronjob(run_id: str, kind: str, request: Request) -> JSONResponse:
        body = await request.json()
        entry = {
            "run_id": run_id,
            "kind": kind,
            "body": body,
            "at": time.time(),
            "traceparent": request.headers.get("traceparent"),
            "token": request.headers.get("x-callback-token"),
            "request_id": request.headers.get("x-request-id"),
            "idempotency_key": request.headers.get("idempotency-key"),
        }
        failed = None
        if kind == "callback":
            failed = await state["faults"]["cronjob"].maybe_fail()
        entry["status"] = failed.status_code if failed else 200
        state["cronjob"].append(entry)
        return failed or JSONResponse({"ok": True})

    @app.post("/alerts/webhook")
    async def alert_webhook(request: Request) -> dict[str, Any]:
        """A recording alert receiver (Alertmanager-style webhook consumers)."""
        failed = await state["faults"]["alerts"].maybe_fail()
        if failed is not None:
            return failed  # type: ignore[return-value]
        state["alerts"].append(await request.json())
        return {"ok": True}

    @app.get("/_alerts")
    async def alerts_received() -> list[dict[str, Any]]:
        return state["alerts"]

    @app.get("/_quotes/calls")
    async def quote_calls() -> list[dict[str, Any]]:
        return state["quote_calls"]

    @app.get("/_cronjob/calls")
    async def cronjob_calls() -> list[dict[str, Any]]:
        return state["cronjob"]

    @app.get("/_stats")
    async def stats() -> dict[str, Any]:
        return {
            "quote_requests": state["quote_requests"],
            "sink_batches": len(state["sink"]),
            "cronjob_calls": len(state["cronjob"]),
        }

    return app
