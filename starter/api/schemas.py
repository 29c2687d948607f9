"""The API's bodies and answers as Pydantic models (SPEC §5): the handlers validate with
them, and ``/openapi.json`` / ``/docs`` show them. Every answer sits inside the envelope
``{"success", "data", "error", "meta"}``; ``Envelope[T]`` documents ``data`` as ``T``."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

T = TypeVar("T")


class ErrorInfo(BaseModel):
    code: str = Field(examples=["INVALID_INPUT"])
    type: str = Field(examples=["ArtemisError"])
    message: str = Field(examples=["params.symbols: List should have at least 1 item"])
    retryable: bool
    fields: list[dict[str, str]] | None = Field(
        None, description="each invalid field and what is wrong with it (422)"
    )


class Meta(BaseModel):
    request_id: str | None = None
    trace_id: str | None = None
    latency_ms: float | None = None


class Envelope(BaseModel, Generic[T]):
    """One envelope for every answer (seed 004 §3.1, with seed 000 §7's trace id)."""

    success: bool
    data: T | None = None
    error: ErrorInfo | None = None
    meta: Meta


# -- bodies ----------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CancelBody(_Body):
    reason: str = Field("cancelled by request", max_length=500)


class PauseBody(_Body):
    reason: str = Field("paused by request", max_length=500, examples=["maintenance window"])


class RateLimitBody(_Body):
    qps: float = Field(gt=0, le=10_000, description="requests per second at the source")


class FeedbackBody(_Body):
    status: Literal["success", "failed"]
    comment: str | None = Field(None, max_length=2000)


class NotesBody(_Body):
    platform: str = Field(min_length=1, max_length=50, examples=["sample"])
    note_ids: list[str] = Field(min_length=1, max_length=100, examples=[["5e7c1a0001"]])

    @field_validator("note_ids")
    @classmethod
    def _ids(cls, v: list[str]) -> list[str]:
        from artemis.security import is_safe_id

        cleaned = [n.strip() for n in v]
        if any(not n for n in cleaned):
            raise ValueError("every note id must be a non-empty string")
        bad = [n for n in cleaned if not is_safe_id(n)]
        if bad:
            raise ValueError(
                f"note id {bad[0][:40]!r}: 1-128 letters, digits and . _ : -, never '..'"
            )
        if len(set(cleaned)) != len(cleaned):
            raise ValueError("ids must be unique")
        return cleaned


# -- answers -----------------------------------------------------------------------------------


class Links(BaseModel):
    self: str
    cancel: str
    ui: str | None = None


class RunAccepted(BaseModel):
    """``?mode=async`` (or a sync run still going after ``server.sync_timeout_s``)."""

    task_code: str
    accepted: bool
    task_id: str
    workflow_id: str
    run_id: str | None = None
    callback_mode: str
    links: Links
    status: str | None = None


class RunResult(BaseModel):
    """``?mode=sync``: the run's end."""

    task_code: str | None = None
    task_id: str | None = None
    workflow_id: str | None = None
    status: str
    duration_ms: int | None = None
    stats: dict[str, Any] = Field(default_factory=dict)
    callback: str | None = None
    error: dict[str, Any] | None = None


class TaskView(BaseModel):
    """A run: the task store's record merged with the live progress query."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    task_code: str | None = None
    workflow_id: str | None = None
    status: str
    progress: dict[str, Any] | None = None
    stats: dict[str, Any] = Field(default_factory=dict)
    error: dict[str, Any] | None = None
    paused: bool | None = None
    qps: float | None = None


class RetryAnswer(BaseModel):
    """POST /tasks/{task_id}/retry: the new execution of a failed run."""

    task_code: str
    task_id: str
    workflow_id: str
    run_id: str | None = None
    retry_attempt: int = Field(description="How many times the run was retried (from 1)")
    retried_error: str = Field(description="The error code the failed attempt ended with")
    resume_from_seq: int = Field(description="The page sequence the fetch goes on from")
    undelivered: list[list[int]] = Field(
        description="Pages fetched before the failure and not delivered, delivered first"
    )
    links: dict[str, str] = Field(default_factory=dict)


class TaskList(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None = None


class CancelAnswer(BaseModel):
    task_id: str
    workflow_id: str
    cancel_requested: bool
    reason: str


class ControlAnswer(BaseModel):
    task_id: str
    workflow_id: str
    action: Literal["paused", "resumed", "rate_changed"]
    reason: str | None = None
    qps: float | None = None


class FeedbackAnswer(BaseModel):
    model_config = ConfigDict(extra="allow")
    task_id: str
    feedback: dict[str, Any] | None = None


class NoteItem(BaseModel):
    id: str
    success: bool
    data: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class NotesSummary(BaseModel):
    total: int
    succeeded: int
    failed: int


class NotesAnswer(BaseModel):
    """The seed's batch shape (seed 004 §3.2): items, summary, error, meta at the top."""

    success: bool
    items: list[NoteItem]
    summary: NotesSummary
    error: ErrorInfo | None = None
    meta: Meta


class TaskType(BaseModel):
    code: str = Field(examples=["pull_stock_quotes"])
    summary: str
    params_schema: dict[str, Any] = Field(description="JSON schema of the task's params")


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    checks: dict[str, str]


def documented(model: type[BaseModel], status: int = 200, description: str = "") -> dict:
    """``responses=`` entry documenting an enveloped answer."""
    return {status: {"model": Envelope[model], "description": description or model.__doc__ or ""}}  # type: ignore[valid-type]


# Every 422 keeps the envelope and names the field (not FastAPI's HTTPValidationError).
INVALID: dict[int | str, dict[str, Any]] = {
    422: {"model": Envelope[None], "description": "INVALID_INPUT naming the field"}
}
