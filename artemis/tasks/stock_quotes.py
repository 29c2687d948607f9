"""``pull_stock_quotes``: daily quotes per symbol from a REST quote API."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from artemis.bounds import OutageTolerance
from artemis.quarantine.policy import RecordPolicyParams
from artemis.sources import PageNumberPaginator, RestSource, Source
from artemis.sources.rest import Search
from artemis.tasks.base import TaskContext, TaskUnit


class QuoteParams(RecordPolicyParams):
    model_config = {"extra": "forbid"}

    symbols: list[str] = Field(min_length=1, max_length=500)
    start: date
    end: date | None = None
    page_size: int = Field(100, ge=1, le=1000)
    # The quote API (task_defaults.pull_stock_quotes.base_url, or the request).
    base_url: str
    # How long an outage of the source or a sink is waited out (docs/architecture.md);
    # default: runs.outage_tolerance_s. 0: fail fast.
    outage_tolerance_s: OutageTolerance = None

    @field_validator("symbols")
    @classmethod
    def _symbols(cls, v: list[str]) -> list[str]:
        out = []
        for s in v:
            s = s.strip().upper()
            if not s or not s.replace(".", "").replace("-", "").isalnum():
                raise ValueError(f"invalid symbol {s!r}")
            out.append(s)
        return out

    @model_validator(mode="after")
    def _window(self) -> QuoteParams:
        if self.end is None:
            self.end = datetime.now(UTC).date()
        if self.end < self.start:
            raise ValueError(f"end ({self.end}) is before start ({self.start})")
        return self


class QuoteRecord(BaseModel):
    """One processed quote: a symbol's day."""

    symbol: str
    date: date
    open: float
    high: float
    low: float
    close: float
    volume: int


class PullStockQuotes(TaskUnit):
    code = "pull_stock_quotes"
    Params = QuoteParams
    Record = QuoteRecord
    record_key = ("symbol", "date")
    summary = "Daily quotes per symbol from the quote API"
    request_url_params = ("base_url",)

    def source_name(self, ctx: TaskContext) -> str:
        return "quotes"

    def describe(self, params: BaseModel) -> str:
        p: QuoteParams = params  # type: ignore[assignment]
        shown = ", ".join(p.symbols[:5]) + (f" +{len(p.symbols) - 5}" if len(p.symbols) > 5 else "")
        return f"{shown} {p.start}..{p.end}"

    def build_sources(self, ctx: TaskContext) -> list[Source]:
        p: QuoteParams = ctx.params  # type: ignore[assignment]
        end = p.end or p.start  # always set by validation; keeps the type checker honest
        return [
            RestSource(
                f"{p.base_url.rstrip('/')}/quotes",
                PageNumberPaginator(page_size=p.page_size),
                Search(
                    params={"symbol": sym, "start": p.start.isoformat(), "end": end.isoformat()},
                    records_path="$.items",
                ),
                name=f"quotes:{sym}",
            )
            for sym in p.symbols
        ]

    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        out = []
        for r in records:
            out.append(
                {
                    "symbol": r["symbol"],
                    "date": r["date"],
                    "open": float(r["open"]),
                    "high": float(r["high"]),
                    "low": float(r["low"]),
                    "close": float(r["close"]),
                    "volume": int(r["volume"]),
                }
            )
        return out
