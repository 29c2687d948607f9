"""One FastAPI app with the quote API, a recording sink receiver and a recording CronJob.

Failures can be injected over HTTP (``POST /_control/{quotes|sink|cronjob}``) and what was
received read back (``GET /_sink/batches``, ``GET /_cronjob/calls``), so tests and the demo
talk to a real server on 127.0.0.1. PubMed and Crossref are in ``literature.py``, the notes
platform in ``platform.py``, the README walk-through's product catalogue in ``catalog.py``,
a GitHub-like tree of repositories, issues and comments under ``/forge`` in ``forge.py``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
import zlib
from collections.abc import AsyncIterator
from datetime import date, timedelta
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from artemis_samples import catalog, forge, platform
from artemis_samples.literature import LiteratureState, build_router


class Faults:
    """Injected failures of one endpoint, set by ``POST /_control/{target}`` (each call
    replaces what was set before; ``{}`` clears it, as ``POST /_control/reset`` does):

    - ``{"status": 503, "times": N}``: the next N requests answer ``status`` (N is 1 when
      not given), with ``retry_after`` as a Retry-After header when given;
    - ``{"delay_ms": D, ...}``: every request waits D ms before it is answered (failed or
      not) until the fault is set again;
    - ``{"status": 503, "for_s": S}``: every request answers ``status`` until S seconds after
      the control call (an outage: a deploy, a maintenance window), then normally again;
      with ``for_s`` set, ``times`` is ignored;
    - ``{"hang": true, "for_s": S}``: a request is accepted and answered nothing until the
      window ends, then it is answered normally (a client's read timeout must cut it);
      setting the fault again (or a reset) ends a held request's wait at once;
    - ``{"trickle_s": T, "for_s": S}``: an answer that would succeed has its headers sent
      at once and its body one byte every T seconds (so a per-read socket timeout above T
      never fires); the rest of a body goes at once when the window ends or the fault is
      set again. Only a window makes ``hang`` and ``trickle_s`` take effect.

    ``GET /_control/{target}`` tells what is set: ``active`` and ``seconds_left``."""

    # How often a held (hung) request looks whether its window was closed early.
    _HOLD_STEP_S = 0.05

    def __init__(self) -> None:
        self.generation = 0
        self.set({})

    def set(self, spec: dict[str, Any]) -> None:
        """Replace the fault by ``spec`` (ValueError/TypeError: a bad value, nothing set)."""
        status = int(spec["status"]) if spec.get("status") is not None else None
        times = int(spec.get("times", 1 if status else 0))
        delay_ms = int(spec.get("delay_ms") or 0)
        retry_after = spec.get("retry_after")
        for_s = spec.get("for_s")
        until = time.monotonic() + float(for_s) if for_s is not None else None
        trickle_s = float(spec.get("trickle_s") or 0)
        if trickle_s < 0 or delay_ms < 0 or (for_s is not None and float(for_s) < 0):
            raise ValueError("for_s, trickle_s and delay_ms must not be negative")
        self.status: int | None = status
        self.times = times
        self.delay_ms = delay_ms
        self.retry_after: str | None = None if retry_after is None else str(retry_after)
        self.until: float | None = until
        self.hang = bool(spec.get("hang"))
        self.trickle_s = trickle_s
        # ``{"bomb_mb": M, "times": N}`` (quotes): the next N answers are a small gzip
        # body (Content-Encoding: gzip) that inflates to M MB — a decompression bomb.
        self.bomb_mb = float(spec.get("bomb_mb") or 0)
        if self.bomb_mb and "times" not in spec:
            self.times = 1
        self.generation += 1

    def take_bomb(self) -> Response | None:
        if not (self.bomb_mb and self.times > 0):
            return None
        self.times -= 1
        return Response(
            _gzip_bomb(int(self.bomb_mb)),
            media_type="application/json",
            headers={"Content-Encoding": "gzip"},
        )

    def window_open(self) -> bool:
        return self.until is not None and time.monotonic() < self.until

    def seconds_left(self) -> float:
        return max(0.0, self.until - time.monotonic()) if self.until is not None else 0.0

    def describe(self) -> dict[str, Any]:
        """What ``GET /_control/{target}`` answers."""
        mode = None
        if self.until is not None:
            if self.window_open():
                mode = "hang" if self.hang else "status" if self.status else None
                mode = mode or ("trickle" if self.trickle_s else None)
        elif self.status and self.times > 0:
            mode = "times"
        return {
            "active": mode is not None,
            "mode": mode,
            "seconds_left": round(self.seconds_left(), 3) if self.until is not None else None,
            "status": self.status,
            "times": self.times,
            "hang": self.hang,
            "trickle_s": self.trickle_s,
            "delay_ms": self.delay_ms,
            "retry_after": self.retry_after,
        }

    async def maybe_fail(self) -> JSONResponse | None:
        if self.delay_ms:
            await asyncio.sleep(self.delay_ms / 1000)
        if self.until is not None:
            if self.hang and self.window_open():
                await self._hold()
                return None
            if self.status and self.window_open():
                return self._answer()
            return None
        if self.status and self.times > 0:
            self.times -= 1
            return self._answer()
        return None

    async def _hold(self) -> None:
        """Hold a request while the hang window is open (and this fault still set)."""
        generation = self.generation
        while self.generation == generation and self.hang and self.window_open():
            await asyncio.sleep(min(self._HOLD_STEP_S, self.seconds_left()))

    def _answer(self) -> JSONResponse:
        headers = {"Retry-After": self.retry_after} if self.retry_after else None
        return JSONResponse(
            {"error": "injected failure"}, status_code=int(self.status or 500), headers=headers
        )

    def respond(self, payload: Any, status_code: int = 200) -> Response:
        """The answer ``payload``: dribbled out a byte at a time while a trickle window is
        open, else at once."""
        if not (self.trickle_s and self.window_open()):
            return JSONResponse(payload, status_code=status_code)
        body = bytes(JSONResponse(payload).body)  # as JSONResponse renders it
        pause = self.trickle_s
        generation = self.generation

        async def drip() -> AsyncIterator[bytes]:
            for i in range(len(body)):
                if self.generation != generation or not self.window_open():
                    yield body[i:]  # the window ended: the rest at once
                    return
                yield body[i : i + 1]
                await asyncio.sleep(pause)

        return StreamingResponse(drip(), status_code=status_code, media_type="application/json")


@functools.lru_cache(maxsize=2)
def _gzip_bomb(megabytes: int) -> bytes:
    """``megabytes`` MB of JSON whitespace, gzip-compressed (about 1,000:1)."""
    out = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip stream
    block = b" " * (1024 * 1024)
    parts = [out.compress(b"{")]
    parts += [out.compress(block) for _ in range(megabytes)]
    parts.append(out.compress(b"}") + out.flush())
    return b"".join(parts)


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
    literature = LiteratureState()
    app.state.literature = literature
    app.include_router(build_router(literature))
    notes = platform.PlatformState()
    app.state.platform = notes
    app.include_router(platform.build_router(notes))
    products = catalog.CatalogState()
    app.state.catalog = products
    app.include_router(catalog.build_router(products))
    tree = forge.ForgeState()
    app.state.forge = tree
    app.include_router(forge.build_router(tree))

    # -- control ---------------------------------------------------------------------
    @app.post("/_control/{target}")
    async def control(target: str, request: Request) -> Any:
        spec = await request.json()
        if target == "latency":
            state["latency_ms"] = float(spec.get("latency_ms", 0))
        elif target == "reset":
            literature.configure({"reset": True})
            notes.reset()
            products.reset()
            tree.reset()
            state["sink"].clear()
            state["cronjob"].clear()
            state["alerts"].clear()
            state["quote_requests"] = 0
            state["quote_calls"].clear()
            for f in state["faults"].values():
                f.set({})
        elif target in state["faults"]:
            if not isinstance(spec, dict):
                return JSONResponse({"error": "a fault is a JSON object"}, status_code=422)
            try:
                state["faults"][target].set(spec)
            except (TypeError, ValueError) as e:
                return JSONResponse({"error": f"bad fault {spec!r}: {e}"}, status_code=422)
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
    ) -> Response:
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
        bomb = state["faults"]["quotes"].take_bomb()
        return bomb or state["faults"]["quotes"].respond(answer)

    # -- sink receiver -----------------------------------------------------------------------
    @app.post("/sink")
    @app.post("/sink/{name}")
    async def sink(request: Request, name: str = "default") -> Response:
        """Records every POST, failed ones with ``records`` None. The body is read before
        a fault holds the request: a batch held by ``hang`` (or ``delay_ms``) is taken when
        the hold ends, even when its client has given up (an answer lost on the way)."""
        body = await request.body()
        failed = await state["faults"]["sink"].maybe_fail()
        entry = {
            "name": name,
            "received_at": time.time(),
            "idempotency_key": request.headers.get("idempotency-key"),
            "traceparent": request.headers.get("traceparent"),
            "request_id": request.headers.get("x-request-id"),
            # what a sink's owner would check (a run's own header, for the tests)
            "authorization": request.headers.get("authorization"),
            "query": str(request.url.query) or None,
            "status": failed.status_code if failed else 200,
        }
        if failed:
            state["sink"].append({**entry, "records": None})
            return failed
        try:
            records = json.loads(body)
        except ValueError:
            return JSONResponse({"error": "body is not JSON"}, status_code=400)
        if not isinstance(records, list):
            return JSONResponse({"error": "body must be a JSON array"}, status_code=400)
        state["sink"].append({**entry, "records": records})
        return state["faults"]["sink"].respond({"accepted": len(records)})

    @app.get("/_sink/batches")
    async def sink_batches() -> list[dict[str, Any]]:
        return state["sink"]

    # -- CronJob receiver --------------------------------------------------------------------
    @app.post("/cronjob/runs/{run_id}/{kind}")
    async def cronjob(run_id: str, kind: str, request: Request) -> Response:
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
        if failed:
            return failed
        return state["faults"]["cronjob"].respond({"ok": True})

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
