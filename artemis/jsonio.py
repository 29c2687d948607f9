"""JSON encoding for record batches (staging and sink bodies): orjson, with ``str`` for
types JSON lacks (dates, decimals), so what is staged is exactly what a sink receives."""

from __future__ import annotations

from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=str)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)
