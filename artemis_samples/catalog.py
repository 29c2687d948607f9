"""A small JSON API of the kind a user brings as "their own" (the README's walk-through
"Add your own API in YAML"): a product catalogue paged by page number, and a stock list
paged by offset, each with its own end marker. Asking past the end is a ``404``, as many
real APIs answer, so a client that does not heed the marker fails visibly.

- ``GET /catalog/products?page=N&per_page=K`` → ``{"products": [{"id", "name", "price",
  "in_stock", "added", "tags"}], "page", "per_page", "total", "next_page"}`` (``next_page``
  null on the last page; 23 products);
- ``GET /catalog/stock?offset=O&limit=L`` → ``{"items": [{"sku", "product_id",
  "quantity", "warehouse", "counted_at"}], "has_more"}`` (31 items);
- ``GET /_catalog/calls`` lists the requests (path and query), ``POST /_control/catalog``
  ``{"reset": true}`` clears them and the spoilt prices; ``{"spoil": [3, 7]}`` has those
  products' prices written as strings (``"8.25"``), as some shops' APIs write money: the
  records that do not fit a ``float`` model, for the quarantine walk-through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

PRODUCTS = 23
STOCK = 31


def product(i: int, spoilt: bool = False) -> dict[str, Any]:
    price = round(4.5 + i * 1.25, 2)
    return {
        "id": i,
        "name": f"Product {i}",
        "price": f"{price:.2f}" if spoilt else price,
        "in_stock": i % 3 != 0,
        "added": (date(2025, 1, 1) + timedelta(days=i * 3)).isoformat(),
        "tags": ["sample", "even" if i % 2 == 0 else "odd"],
    }


def stock_item(i: int) -> dict[str, Any]:
    return {
        "sku": f"SKU-{i:03d}",
        "product_id": 1 + i % PRODUCTS,
        "quantity": (i * 7) % 40,
        "warehouse": "north" if i % 2 else "south",
        "counted_at": (datetime(2025, 3, 1, 8, 0) + timedelta(hours=i)).isoformat() + "Z",
    }


@dataclass
class CatalogState:
    calls: list[dict[str, Any]] = field(default_factory=list)
    spoilt: set[int] = field(default_factory=set)

    def reset(self) -> None:
        self.calls.clear()
        self.spoilt.clear()


def build_router(state: CatalogState) -> APIRouter:
    router = APIRouter()

    def _record(request: Request) -> None:
        state.calls.append({"path": request.url.path, "params": dict(request.query_params)})

    @router.get("/catalog/products")
    async def products(request: Request, page: int = 1, per_page: int = 10):
        _record(request)
        if page < 1 or not 1 <= per_page <= 100:
            return JSONResponse({"error": "page >= 1, 1 <= per_page <= 100"}, status_code=400)
        pages = -(-PRODUCTS // per_page)
        if page > pages:
            return JSONResponse(
                {"error": f"page {page} does not exist ({pages} pages)"}, status_code=404
            )
        first = (page - 1) * per_page + 1
        ids = range(first, min(first + per_page, PRODUCTS + 1))
        return {
            "products": [product(i, i in state.spoilt) for i in ids],
            "page": page,
            "per_page": per_page,
            "total": PRODUCTS,
            "next_page": page + 1 if page < pages else None,
        }

    @router.get("/catalog/stock")
    async def stock(request: Request, offset: int = 0, limit: int = 10):
        _record(request)
        if offset < 0 or not 1 <= limit <= 100:
            return JSONResponse({"error": "offset >= 0, 1 <= limit <= 100"}, status_code=400)
        if offset >= STOCK:
            return JSONResponse(
                {"error": f"offset {offset} is past the end ({STOCK} items)"}, status_code=404
            )
        items = [stock_item(i) for i in range(offset, min(offset + limit, STOCK))]
        return {"items": items, "has_more": offset + limit < STOCK}

    @router.get("/_catalog/calls")
    async def calls() -> list[dict[str, Any]]:
        return state.calls

    @router.post("/_control/catalog")
    async def control(request: Request) -> Any:
        spec = await request.json()
        if isinstance(spec, dict) and spec.get("reset"):
            state.reset()
        if isinstance(spec, dict) and isinstance(spec.get("spoil"), list):
            state.spoilt = {int(i) for i in spec["spoil"]}
        return {"ok": True}

    return router
