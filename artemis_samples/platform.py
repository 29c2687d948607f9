"""A sample note platform that behaves like a real one for the crawler: search
by keyword in pages, note details behind a login cookie, a per-session rate limit with
``429`` + ``Retry-After``, slow or failing notes on demand.

- ``GET /platform/search?keyword=&page=&page_size=`` → ``{"items": [{"note_id",
  "note_url"}], "next_page"}`` (``next_page`` null on the last
  page; 25 notes per keyword, deterministic).
- ``GET /platform/notes/{note_id}`` → ``{"note_id", "title", "content", "author",
  "liked_count", "published_at"}``. Needs ``Cookie: web_session=sample-…``; a missing,
  unknown or revoked session is ``401``, an id no search lists ``404``.
- ``POST /_control/platform`` sets ``revoked`` sessions, ``slow_ids`` (+ ``slow_ms``),
  ``fail_ids`` (id → status), ``rate_per_s`` per session, ``notes_per_keyword``,
  ``search_fail`` (``{"status", "times"}``), ``reset``; ``GET /_platform/calls`` lists
  the detail calls (note id, status, a hash of the session — never the session itself),
  ``GET /_platform/stats`` counts the calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

SESSION_PREFIX = "sample-"


@dataclass
class PlatformState:
    revoked: set[str] = field(default_factory=set)
    slow_ids: set[str] = field(default_factory=set)
    slow_ms: int = 0
    fail_ids: dict[str, int] = field(default_factory=dict)
    rate_per_s: float = 0.0
    notes_per_keyword: int = 25
    search_fail_status: int = 0
    search_fail_times: int = 0
    search_calls: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    last_call: dict[str, float] = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


def note_ids(keyword: str, n: int) -> list[str]:
    tag = hashlib.sha256(keyword.encode()).hexdigest()[:6]
    return [f"{tag}{i:04d}" for i in range(n)]


def note_for(note_id: str) -> dict[str, Any]:
    h = int(hashlib.sha256(note_id.encode()).hexdigest()[:8], 16)
    return {
        "note_id": note_id,
        "title": f"Note {note_id}",
        "content": f"Sample content of note {note_id}, {h % 997} words long.",
        "author": f"user{h % 89}",
        "liked_count": h % 5000,
        "published_at": f"2025-{1 + h % 12:02d}-{1 + h % 28:02d}",
    }


def is_note_id(note_id: str) -> bool:
    """Whether the platform has this note (every id a search lists: 6 hex + 4 digits)."""
    return re.fullmatch(r"[0-9a-f]{6}\d{4}", note_id) is not None


def _session(request: Request) -> str | None:
    raw = request.headers.get("cookie") or ""
    for part in raw.split(";"):
        name, _, value = part.strip().partition("=")
        if name == "web_session" and value:
            return value
    return None


def build_router(state: PlatformState) -> APIRouter:
    router = APIRouter()

    def _auth(request: Request) -> tuple[str | None, JSONResponse | None]:
        session = _session(request)
        if session is None or not session.startswith(SESSION_PREFIX) or session in state.revoked:
            return session, JSONResponse({"error": "login required"}, status_code=401)
        if state.rate_per_s > 0:
            now = time.monotonic()
            last = state.last_call.get(session)
            if last is not None and now - last < 1 / state.rate_per_s:
                wait = max(1, round(1 / state.rate_per_s - (now - last) + 0.5))
                return session, JSONResponse(
                    {"error": "rate limited"}, status_code=429, headers={"Retry-After": str(wait)}
                )
            state.last_call[session] = now
        return session, None

    @router.get("/platform/search")
    async def search(request: Request, keyword: str, page: int = 1, page_size: int = 10):
        state.search_calls += 1
        if state.search_fail_times > 0:
            state.search_fail_times -= 1
            return JSONResponse({"error": "injected failure"}, status_code=state.search_fail_status)
        session, refused = _auth(request)
        if refused is not None:
            return refused
        ids = note_ids(keyword, state.notes_per_keyword)
        start = (max(page, 1) - 1) * page_size
        chunk = ids[start : start + page_size]
        items = [{"note_id": i, "note_url": f"/platform/notes/{i}"} for i in chunk]
        return {"items": items, "next_page": page + 1 if start + page_size < len(ids) else None}

    @router.get("/platform/notes/{note_id}")
    async def detail(note_id: str, request: Request):
        session, refused = _auth(request)
        status = refused.status_code if refused is not None else 200
        call: dict[str, Any] = {
            "note_id": note_id,
            "status": None,  # recorded on arrival, the status once answered
            "session_hash": hashlib.sha256((session or "").encode()).hexdigest()[:12],
        }
        state.calls.append(call)
        if refused is None and note_id in state.slow_ids:
            await asyncio.sleep(state.slow_ms / 1000)
        if refused is None and note_id in state.fail_ids:
            status = state.fail_ids[note_id]
        elif refused is None and not is_note_id(note_id):
            status = 404
        call["status"] = status
        if refused is not None:
            return refused
        if status == 404:
            return JSONResponse({"error": f"note {note_id} not found"}, status_code=404)
        if status != 200:
            return JSONResponse({"error": "injected failure"}, status_code=status)
        return note_for(note_id)

    @router.post("/_control/platform")
    async def control(request: Request):
        spec = await request.json()
        if spec.get("reset"):
            state.reset()
        if "revoked" in spec:
            state.revoked = set(spec["revoked"])
        if "slow_ids" in spec:
            state.slow_ids = set(spec["slow_ids"])
        if "slow_ms" in spec:
            state.slow_ms = int(spec["slow_ms"])
        if "fail_ids" in spec:
            state.fail_ids = {str(k): int(v) for k, v in spec["fail_ids"].items()}
        if "rate_per_s" in spec:
            state.rate_per_s = float(spec["rate_per_s"])
            state.last_call.clear()
        if "search_fail" in spec:
            state.search_fail_status = int(spec["search_fail"].get("status", 500))
            state.search_fail_times = int(spec["search_fail"].get("times", 1))
        if "notes_per_keyword" in spec:
            state.notes_per_keyword = int(spec["notes_per_keyword"])
        return {"ok": True}

    @router.get("/_platform/calls")
    async def calls():
        return state.calls

    @router.get("/_platform/stats")
    async def stats():
        return {"search_calls": state.search_calls, "detail_calls": len(state.calls)}

    return router
