"""One record traced through a run: every product file one of whose functions received
it — as the source's answer (bytes or text), as a record (a dict) or among a page's
records — is found by a profile hook on the API, the in-process worker and the threads
they hand work to, and must be on the record's path that docs/architecture.md lists (and
the list names nothing the record did not pass).

The record is marked by a value only it carries: the volume the sample quote API gives
one symbol on one day (artemis_samples/app.py ``quote_for``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import re
import sys
import threading
from datetime import date
from pathlib import Path
from typing import Any

from artemis_samples.app import quote_for
from tests.conftest import new_task_id

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = tuple(
    str(ROOT / p) + "/" for p in ("artemis", "activities", "workflows", "starter", "workers")
)
DOC = ROOT / "docs" / "architecture.md"
SYMBOL, DAY = "TRC", date(2025, 3, 3)
# How deep into containers and product objects a call's arguments are searched.
DEPTH = 4
WIDTH = 500


class RecordTrace:
    """The product files whose functions were called with the marked record."""

    def __init__(self, mark: int) -> None:
        self.mark = mark
        self.text = str(mark)
        self.raw = self.text.encode()
        self.files: dict[str, str] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(PRODUCT) or path in self.files:
            return
        try:
            held = any(self._holds(v, DEPTH) for v in list(frame.f_locals.values()))
        except Exception:  # a value that cannot be looked into (a closed buffer, …)
            return
        if held:
            self.files[path] = frame.f_code.co_qualname

    def _holds(self, value: Any, depth: int) -> bool:
        if isinstance(value, bool):
            return False
        if isinstance(value, int):
            return value == self.mark
        if isinstance(value, str):
            return self.text in value
        if isinstance(value, bytes | bytearray):
            return self.raw in value
        if depth == 0:
            return False
        if isinstance(value, dict):
            items = list(value.values())[:WIDTH]
        elif isinstance(value, list | tuple):
            items = list(value[:WIDTH])
        elif dataclasses.is_dataclass(value) or type(value).__module__.startswith(
            ("artemis.", "activities.")
        ):
            items = list(getattr(value, "__dict__", {}).values())[:WIDTH]
        else:
            return False
        return any(self._holds(v, depth - 1) for v in items)

    def relative(self) -> set[str]:
        return {str(Path(p).relative_to(ROOT)) for p in self.files}


def listed_path() -> list[str]:
    """The files of the record's path as docs/architecture.md numbers them."""
    text = DOC.read_text()
    section = text.split("## The record's path", 1)[1].split("\n## ", 1)[0]
    block = section.split("Then the record itself", 1)[1].split("```", 2)[1]
    return re.findall(r"^\s*\d+\s+(\S+\.py)\s", block, flags=re.M)


async def test_the_record_s_path_in_the_docs_is_every_file_a_record_passes(stack):
    mark = quote_for(SYMBOL, DAY)["volume"]
    trace = RecordTrace(mark)
    loop = asyncio.get_running_loop()
    fresh = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="traced")
    loop.set_default_executor(fresh)
    threading.setprofile(trace)
    sys.setprofile(trace)
    try:
        task_id = new_task_id()
        body = {
            "meta": {"task_id": task_id},
            "params": {"symbols": [SYMBOL], "start": "2025-03-01", "end": "2025-03-05"},
        }
        resp = await stack.run(body)
        assert resp.status_code == 200, resp.text
        assert resp.json()["data"]["status"] == "completed"
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    sent = await stack.sink_batches(f"pull_stock_quotes/{task_id}:")
    assert any(r.get("volume") == mark for b in sent for r in b["records"]), "not delivered"
    passed = trace.relative()
    listed = listed_path()
    assert passed, "the trace saw no file"
    missing = sorted(passed - set(listed))
    assert not missing, f"the record passed {missing}, not in docs/architecture.md's path"
    extra = sorted(set(listed) - passed)
    assert not extra, f"docs/architecture.md lists {extra}, which the record did not pass"
    assert len(listed) == len(set(listed)) <= 12, listed
