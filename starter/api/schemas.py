"""The API's bodies and answers as Pydantic models (docs/api.md): the handlers validate with
them, and ``/openapi.json`` / ``/docs`` show them. Every answer sits inside the envelope
``{"success", "data", "error", "meta"}``; ``Envelope[T]`` documents ``data`` as ``T``."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from artemis.event_kinds import Control
from artemis.run_state import RunStatus, Verdict
from artemis.security import is_safe_id

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
    """One envelope for every answer, with the request's trace id (docs/api.md)."""

    success: bool
    data: T | None = None
    error: ErrorInfo | None = None
    meta: Meta


# -- bodies ----------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# A task id (and a CronJob run id) becomes a path segment: of the files sink's folders, of
# the CronJob's URLs ({base}/{run_id}/progress).
_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


class CallbackMeta(_Body):
    """The CronJob to call back (docs/api.md): where (else ``callback.base_url``), and
    the header and token to send (the token is kept as a run secret, never in history)."""

    base_url: str | None = None
    override_host: str | None = None
    override_port: int | None = Field(None, ge=1, le=65535)
    auth_header: str | None = None
    # A run secret: bounded like a sink header's value (a longer one is no token).
    auth_token: str | None = Field(None, max_length=4096)


class RunMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    run_id: str | int | None = None
    task_id: str | None = Field(None, min_length=1, max_length=128)
    exec_type: str | None = None
    request_id: str | None = None
    # A run's deadline: at most 30 days (a Temporal timer needs a finite duration).
    timeout_s: float | None = Field(None, gt=0, le=30 * 24 * 3600, allow_inf_nan=False)
    callback: CallbackMeta | None = None

    @field_validator("task_id")
    @classmethod
    def _task_id(cls, v: str | None) -> str | None:
        if v is not None and not set(v) <= _ID_CHARS:
            raise ValueError("may only hold letters, digits and - _ . :")
        if v in (".", ".."):
            # a task id names the run's folder of the files sink: never a path step
            raise ValueError("may not be '.' or '..'")
        return v

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, v: str | int | None) -> str | int | None:
        text = str(v) if v is not None else None
        if text is not None and (
            not text or len(text) > 128 or not set(text) <= _ID_CHARS or ".." in text or text == "."
        ):
            raise ValueError(
                "1-128 letters, digits and - _ . : (it is a path segment of the CronJob's "
                "URLs), never '.' or '..'"
            )
        return v


class RunParams(BaseModel):
    """The task's params, checked by the task's own model when the run starts
    (``GET /task-types`` shows each task's schema). They may carry the CronJob callback
    too (docs/api.md); it is not a param."""

    model_config = ConfigDict(extra="allow")
    callback: CallbackMeta | None = None

    def task_params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class RunBody(_Body):
    """``{"meta": {...}, "body": {...params}}`` or ``{"params": {...}}``."""

    meta: RunMeta = Field(default_factory=RunMeta)
    body: RunParams | None = None
    params: RunParams | None = None
    output: dict[str, Any] | None = Field(
        None, description="where the records go: sinks and their settings, over output_defaults"
    )

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        if not isinstance(data, dict | BaseModel):
            kind = type(data).__name__
            raise PydanticCustomError(
                "json_object", "expected a JSON object, got {kind}", {"kind": kind}
            )
        return data

    @model_validator(mode="after")
    def _one_params(self) -> RunBody:
        if self.body is not None and self.params is not None:
            raise PydanticCustomError(
                "params_twice", "give the params either as 'body' or as 'params', not both"
            )
        return self

    @property
    def given_params(self) -> RunParams:
        """The params as given, under ``body`` or ``params`` (none: empty)."""
        return self.body or self.params or RunParams()

    @property
    def callback(self) -> CallbackMeta | None:
        """The CronJob callback: ``meta.callback``, else one inside the params."""
        return self.meta.callback or self.given_params.callback


class CancelBody(_Body):
    reason: str = Field("cancelled by request", max_length=500)


class PauseBody(_Body):
    reason: str = Field("paused by request", max_length=500, examples=["maintenance window"])


class RateLimitBody(_Body):
    qps: float = Field(
        gt=0, le=10_000, allow_inf_nan=False, description="requests per second at the source"
    )


class FeedbackBody(_Body):
    status: Verdict = Field(description="the user's verdict: success or failed")
    comment: str | None = Field(None, max_length=2000)


class NotesBody(_Body):
    platform: str = Field(min_length=1, max_length=50, examples=["sample"])
    note_ids: list[str] = Field(min_length=1, max_length=100, examples=[["5e7c1a0001"]])

    @field_validator("note_ids")
    @classmethod
    def _ids(cls, v: list[str]) -> list[str]:
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
    defaults_applied: list[str] = Field(
        default_factory=list,
        description="Params the request left out that task_defaults.<code> gave the run",
    )
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
    defaults_applied: list[str] = Field(
        default_factory=list,
        description="Params the request left out that task_defaults.<code> gave the run",
    )


class TaskView(BaseModel):
    """A run: the task store's record merged with the live progress query."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    task_code: str | None = None
    provenance: str | None = Field(
        None, description="The source it harvests (a registry provenance, a crawl's platform)"
    )
    workflow_id: str | None = None
    owner: str | None = Field(None, description="The name of the API token that started it")
    status: RunStatus
    progress: dict[str, Any] | None = None
    stats: dict[str, Any] = Field(default_factory=dict)
    error: dict[str, Any] | None = None
    paused: bool | None = None
    qps: float | None = None
    build: str | None = Field(
        None, description="While it runs: the worker build it is pinned to (artemis builds)"
    )


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
    action: Control
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
    """The batch answer: items, summary, error, meta at the top."""

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
