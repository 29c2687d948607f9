"""The provenance registry (docs/registry.md): one row per source in ``reg_provenance``
and one table per configuration dimension, each row scoped (SOURCE | TASK + task type) and
valid over a half-open UTC interval ``[effective_from, effective_to)``.

Column names are the registry's established ones, so SQL written against them keeps working.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, Column, Computed, Float, ForeignKey, Index, Integer, String, Text
from sqlmodel import Field, SQLModel

from artemis.db import UTCDateTime, utcnow

SCOPES = ("SOURCE", "TASK")
TASK_TYPES = ("harvest", "update", "backfill")
PAGINATION_MODES = (
    "PAGE_NUMBER",
    "OFFSET",
    "CURSOR",
    "TOKEN",
    "SCROLL",
    "LINK_HEADER",
    "NEXT_URL",
    "SINGLE",
)
ENDPOINT_USAGES = ("SEARCH", "DETAIL", "TOKEN")
RESPONSE_FORMATS = ("JSON", "XML")
REQUEST_CONTENT_TYPES = ("application/json", "application/x-www-form-urlencoded")
PAGING_PLACES = ("QUERY", "BODY")
RECORD_FAMILIES = ("PUBMED", "CROSSREF")
BAD_RECORD_POLICIES = ("QUARANTINE", "FAIL")
SCHEMA_CONTRACTS = ("EVOLVE", "FREEZE", "DISCARD")
OFFSET_TYPES = ("DATE", "ID", "COMPOSITE")
LIFECYCLE_STATUSES = ("ACTIVE", "PAUSED", "DEPRECATED", "RETIRED")


def _task_type_key() -> Column:
    # A generated column IFNULL(task_type, 'ALL'): keys the unique interval index.
    return Column(String(16), Computed("COALESCE(task_type, 'ALL')", persisted=True))


class RegProvenance(SQLModel, table=True):
    __tablename__ = "reg_provenance"

    id: int | None = Field(default=None, primary_key=True)
    provenance_code: str = Field(max_length=64, unique=True, index=True)
    provenance_name: str = Field(max_length=200)
    base_url_default: str | None = Field(default=None, max_length=500)
    timezone_default: str = Field(default="UTC", max_length=64)
    docs_url: str | None = Field(default=None, max_length=500)
    lifecycle_status_code: str = Field(default="ACTIVE", max_length=16)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


# The dimensions a resource has rows of its own in (docs/registry.md "Resources"): what it
# asks, how it pages, its record model and its window. The others are the provenance's.
RESOURCE_TABLES = (
    "reg_prov_endpoint_def",
    "reg_prov_pagination_cfg",
    "reg_prov_record_model",
    "reg_prov_window_offset_cfg",
)
# The resource of a provenance file that names none: its rows, table and folder are the
# provenance's own.
DEFAULT_RESOURCE = ""


def _resource_name() -> Any:
    return Field(default=DEFAULT_RESOURCE, max_length=64, sa_column_kwargs={"server_default": ""})


class DimensionBase(SQLModel):
    """Columns every dimension row has: owner, scope and effective interval."""

    id: int | None = Field(default=None, primary_key=True)
    provenance_id: int = Field(foreign_key="reg_provenance.id")
    scope_code: str = Field(max_length=16)
    task_type: str | None = Field(default=None, max_length=16)
    effective_from: datetime = Field(sa_type=UTCDateTime)
    effective_to: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)

    # The dimension's name in the contract and in YAML files.
    dimension: ClassVar[str]
    # Extra columns that identify a row within (provenance, scope, task type, from).
    identity: ClassVar[tuple[str, ...]] = ()


def _interval_index(table: str, *extra: str) -> tuple[Index, Index]:
    cols = ("provenance_id", "scope_code", "task_type_key", *extra, "effective_from")
    if table in RESOURCE_TABLES and "endpoint_name" not in extra:
        # A resource's rows are its own: two resources' rows may start at one instant
        # (an endpoint is known by its name, one per provenance).
        cols = ("provenance_id", "scope_code", "task_type_key", *extra, "resource_name")
        cols += ("effective_from",)
    return (
        Index(f"uq_{table}_interval", *cols, unique=True),
        Index(f"ix_{table}_lookup", "provenance_id", "scope_code", "task_type", "effective_to"),
    )


class RegProvEndpointDef(DimensionBase, table=True):
    __tablename__ = "reg_prov_endpoint_def"
    __table_args__ = _interval_index("reg_prov_endpoint_def", "endpoint_name")
    dimension: ClassVar[str] = "endpoint_def"
    identity: ClassVar[tuple[str, ...]] = ("endpoint_name",)

    task_type_key: str | None = Field(default=None, sa_column=_task_type_key())
    resource_name: str = _resource_name()
    endpoint_name: str = Field(max_length=100)
    endpoint_usage_code: str = Field(max_length=32)  # SEARCH | DETAIL | TOKEN | ...
    http_method_code: str = Field(default="GET", max_length=8)
    path_template: str = Field(max_length=500)
    default_query_params: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    default_body_payload: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    request_content_type: str | None = Field(default=None, max_length=100)
    response_format_code: str | None = Field(default=None, max_length=16)  # JSON | XML
    is_auth_required: bool = False
    # Endpoint-level parameter names win over the pagination/batching cfg.
    page_param_name: str | None = Field(default=None, max_length=64)
    page_size_param_name: str | None = Field(default=None, max_length=64)
    cursor_param_name: str | None = Field(default=None, max_length=64)
    offset_param_name: str | None = Field(default=None, max_length=64)
    limit_param_name: str | None = Field(default=None, max_length=64)
    token_param_name: str | None = Field(default=None, max_length=64)
    id_param_name: str | None = Field(default=None, max_length=64)
    # A sub-resource (SEARCH row of a resource): the resource whose records it is asked
    # for (``{parent.field}`` in its path, query or body), the parent fields copied into
    # each of its records, and the table and folder it lands in (default
    # ``{provenance}__{resource}``).
    parent_resource_name: str | None = Field(default=None, max_length=64)
    include_from_parent_json: list[Any] | dict[str, Any] | None = Field(default=None, sa_type=JSON)
    output_name: str | None = Field(default=None, max_length=63)
    # Answers that are not errors (or errors inside a 200): rules matching a status or the
    # body, each with an action (ignore | retry | fail).
    response_actions_json: list[dict[str, Any]] | None = Field(default=None, sa_type=JSON)


class RegProvWindowOffsetCfg(DimensionBase, table=True):
    __tablename__ = "reg_prov_window_offset_cfg"
    __table_args__ = _interval_index("reg_prov_window_offset_cfg")
    dimension: ClassVar[str] = "window_offset_cfg"
    identity: ClassVar[tuple[str, ...]] = ("resource_name",)

    task_type_key: str | None = Field(default=None, sa_column=_task_type_key())
    resource_name: str = _resource_name()
    window_mode_code: str | None = Field(default=None, max_length=16)  # SLIDING | CALENDAR
    window_size_value: int | None = None
    window_size_unit_code: str | None = Field(default=None, max_length=16)  # MINUTE|HOUR|DAY
    overlap_value: int | None = None
    overlap_unit_code: str | None = Field(default=None, max_length=16)
    lookback_value: int | None = None
    lookback_unit_code: str | None = Field(default=None, max_length=16)
    watermark_lag_seconds: int | None = None
    offset_type_code: str | None = Field(default=None, max_length=16)  # DATE | ID | COMPOSITE
    default_date_field_name: str | None = Field(default=None, max_length=64)
    # How a window is asked of a source of no paper family: the parameters its ends go in
    # and how an instant is written there.
    window_start_param_name: str | None = Field(default=None, max_length=64)
    window_end_param_name: str | None = Field(default=None, max_length=64)
    window_time_format: str | None = Field(default=None, max_length=64)
    # Incremental pointers read from the records: the field whose largest value becomes
    # the watermark (DATE: a timestamp, ID: an id, COMPOSITE: the timestamp), the id that
    # breaks ties (COMPOSITE) and the parameter an ID/COMPOSITE pointer's id is sent in.
    watermark_field_name: str | None = Field(default=None, max_length=64)
    watermark_id_field_name: str | None = Field(default=None, max_length=64)
    watermark_id_param_name: str | None = Field(default=None, max_length=64)


class RegProvPaginationCfg(DimensionBase, table=True):
    __tablename__ = "reg_prov_pagination_cfg"
    __table_args__ = _interval_index("reg_prov_pagination_cfg")
    dimension: ClassVar[str] = "pagination_cfg"
    identity: ClassVar[tuple[str, ...]] = ("resource_name",)

    task_type_key: str | None = Field(default=None, sa_column=_task_type_key())
    resource_name: str = _resource_name()
    # PAGE_NUMBER | OFFSET | CURSOR | TOKEN | SCROLL | LINK_HEADER
    pagination_mode_code: str = Field(max_length=16)
    page_size_value: int | None = None
    max_page_size_value: int | None = None
    page_number_param_name: str | None = Field(default=None, max_length=64)
    page_size_param_name: str | None = Field(default=None, max_length=64)
    start_page_number: int | None = None
    offset_param_name: str | None = Field(default=None, max_length=64)
    limit_param_name: str | None = Field(default=None, max_length=64)
    cursor_param_name: str | None = Field(default=None, max_length=64)
    next_cursor_jsonpath: str | None = Field(default=None, max_length=200)
    initial_cursor_value: str | None = Field(default=None, max_length=200)
    token_param_name: str | None = Field(default=None, max_length=64)
    next_token_jsonpath: str | None = Field(default=None, max_length=200)
    total_count_jsonpath: str | None = Field(default=None, max_length=200)
    records_jsonpath: str | None = Field(default=None, max_length=200)
    max_result_window: int | None = None  # e.g. 9,999 for PubMed esearch
    # Completeness (docs/architecture.md): the source documents that a page shorter than
    # the page size is the last (Crossref does); a token API documents leaving its token
    # out on the last page; where a record's key is (a repeated page is caught by
    # content); the shortfall against the stated total a run accepts, in percent
    # (default 0).
    short_page_is_last: bool | None = None
    absent_token_is_last: bool | None = None
    record_key_jsonpath: str | None = Field(default=None, max_length=200)
    completeness_tolerance_pct: float | None = None
    # The server keeps a cursor session's position (Crossref: one cursor value for the
    # whole walk), so a resumed attempt re-opens the session instead of re-sending it.
    stateful_cursor: bool | None = None
    # PAGE_NUMBER / OFFSET: the source's own end marker, present on every page — the next
    # page number (offset) or null/false on the last page, or a true/false "has more".
    next_page_jsonpath: str | None = Field(default=None, max_length=200)
    has_more_jsonpath: str | None = Field(default=None, max_length=200)
    # NEXT_URL: where the answer holds the next page's URL (null or absent: the last page).
    next_url_jsonpath: str | None = Field(default=None, max_length=200)
    # Where the paging parameters go: the query string, or the body of a POST search (a
    # dot in a parameter name nests it there).
    paging_params_in_code: str | None = Field(default=None, max_length=16)  # QUERY | BODY
    # SCROLL: the request that continues a scroll (its path, the keep-alive sent with it
    # and where the scroll id is read and sent) and the path a finished scroll is
    # released at (DELETE).
    scroll_path_template: str | None = Field(default=None, max_length=500)
    scroll_keep_alive_value: str | None = Field(default=None, max_length=32)
    scroll_keep_alive_param_name: str | None = Field(default=None, max_length=64)
    scroll_id_jsonpath: str | None = Field(default=None, max_length=200)
    scroll_id_param_name: str | None = Field(default=None, max_length=64)
    scroll_release_path_template: str | None = Field(default=None, max_length=500)


class RegProvHttpCfg(DimensionBase, table=True):
    __tablename__ = "reg_prov_http_cfg"
    __table_args__ = _interval_index("reg_prov_http_cfg")
    dimension: ClassVar[str] = "http_cfg"

    task_type_key: str | None = Field(default=None, sa_column=_task_type_key())
    base_url_override: str | None = Field(default=None, max_length=500)
    default_headers_json: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    timeout_connect_millis: int | None = None
    timeout_read_millis: int | None = None
    tls_verify_enabled: bool | None = None
    # A CA bundle file on the worker that this source's certificates are verified against
    # (None: the client's own trust store).
    tls_ca_bundle_path: str | None = Field(default=None, max_length=500)
    proxy_url: str | None = Field(default=None, max_length=500)
    accept_compress: bool | None = None
    prefer_http2: bool | None = None
    # The largest answer read from this source, after decompression (None:
    # http_client.max_body_bytes).
    max_body_bytes: int | None = None


class RegProvBatchingCfg(DimensionBase, table=True):
    __tablename__ = "reg_prov_batching_cfg"
    __table_args__ = _interval_index("reg_prov_batching_cfg")
    dimension: ClassVar[str] = "batching_cfg"

    task_type_key: str | None = Field(default=None, sa_column=_task_type_key())
    detail_batch_size: int | None = None
    id_param_name: str | None = Field(default=None, max_length=64)
    id_joiner: str | None = Field(default=None, max_length=8)
    max_parallel_requests: int | None = None
    post_threshold_ids: int | None = None  # id lists longer than this go by POST
    request_template_json: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    # The DETAIL flow of a source of no paper family: where a SEARCH record's id is (None:
    # pagination_cfg.record_key_jsonpath) and where a DETAIL answer's records are.
    detail_id_jsonpath: str | None = Field(default=None, max_length=200)
    detail_records_jsonpath: str | None = Field(default=None, max_length=200)


class RegProvRetryCfg(DimensionBase, table=True):
    __tablename__ = "reg_prov_retry_cfg"
    __table_args__ = _interval_index("reg_prov_retry_cfg")
    dimension: ClassVar[str] = "retry_cfg"

    task_type_key: str | None = Field(default=None, sa_column=_task_type_key())
    max_retries: int | None = None
    backoff_policy_code: str | None = Field(default=None, max_length=16)  # FIXED|EXPONENTIAL
    initial_delay_millis: int | None = None
    max_delay_millis: int | None = None
    retry_http_statuses_json: list[int] | None = Field(default=None, sa_type=JSON)
    giveup_http_statuses_json: list[int] | None = Field(default=None, sa_type=JSON)
    respect_retry_after: bool | None = None
    circuit_break_threshold: int | None = None
    circuit_cool_down_millis: int | None = None
    # How long an outage of this source is waited out before the run fails
    # SOURCE_UNAVAILABLE (None: runs.outage_tolerance_s; 0: fail fast).
    outage_tolerance_millis: int | None = None


class RegProvRateLimitCfg(DimensionBase, table=True):
    __tablename__ = "reg_prov_rate_limit_cfg"
    __table_args__ = _interval_index("reg_prov_rate_limit_cfg")
    dimension: ClassVar[str] = "rate_limit_cfg"

    task_type_key: str | None = Field(default=None, sa_column=_task_type_key())
    qps_limit: float | None = None
    burst_capacity: int | None = None
    max_concurrency: int | None = None
    bucket_granularity_code: str | None = Field(default=None, max_length=16)
    # The source's own rate-limit headers (artemis/registry/limit_headers.py): which style
    # it answers (NONE | X_RATELIMIT | IETF), under which names, how its reset is written,
    # and how many remaining requests already close the gate.
    ratelimit_headers_code: str | None = Field(default=None, max_length=16)
    remaining_header_name: str | None = Field(default=None, max_length=64)
    reset_header_name: str | None = Field(default=None, max_length=64)
    policy_header_name: str | None = Field(default=None, max_length=64)
    reset_format_code: str | None = Field(default=None, max_length=16)
    remaining_reserve_value: int | None = None


class RegProvRecordModel(DimensionBase, table=True):
    """The shape of a provenance's records: a family Artemis normalises (PubMed, Crossref:
    the paper shape) or a model of fields and key (``artemis.sinks.records.RecordModelDecl``)
    the sql and files sinks type by. Dated like every dimension, so a model change switches
    over at an instant and each run keeps the model it started with."""

    __tablename__ = "reg_prov_record_model"
    __table_args__ = _interval_index("reg_prov_record_model")
    dimension: ClassVar[str] = "record_model"
    identity: ClassVar[tuple[str, ...]] = ("resource_name",)

    task_type_key: str | None = Field(default=None, sa_column=_task_type_key())
    resource_name: str = _resource_name()
    record_family_code: str | None = Field(default=None, max_length=16)  # PUBMED | CROSSREF
    key_json: list[str] | None = Field(default=None, sa_type=JSON)
    fields_json: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    # What a run does with a record that does not fit, and with a field the model does
    # not name (artemis/quarantine/); None: the run's params, else the defaults.
    on_bad_record_code: str | None = Field(default=None, max_length=16)
    max_bad_records_value: str | None = Field(default=None, max_length=16)
    schema_contract_code: str | None = Field(default=None, max_length=16)
    coerce_types_enabled: bool | None = None
    # Steps that shape each record before the check (artemis/registry/record_steps.py).
    record_steps_json: list[dict[str, Any]] | None = Field(default=None, sa_type=JSON)


class RegProvCredential(DimensionBase, table=True):
    """Keys and tokens. Several may be valid at once (rotation); the secret is stored
    encrypted and never leaves an activity in clear."""

    __tablename__ = "reg_prov_credential"
    __table_args__ = (
        *_interval_index("reg_prov_credential", "credential_name")[:1],
        Index(
            "ix_reg_prov_credential_lookup",
            "provenance_id",
            "lifecycle_status_code",
            "deleted",
            "endpoint_id",
            "scope_code",
            "task_type",
        ),
    )
    dimension: ClassVar[str] = "credential"
    identity: ClassVar[tuple[str, ...]] = ("credential_name",)

    task_type_key: str | None = Field(default=None, sa_column=_task_type_key())
    endpoint_id: int | None = Field(default=None, foreign_key="reg_prov_endpoint_def.id")
    credential_name: str = Field(max_length=100)
    # API_KEY_QUERY | API_KEY_HEADER | BEARER | BASIC | OAUTH2_CLIENT_CREDENTIALS |
    # OAUTH2_REFRESH_TOKEN | SESSION_TOKEN
    auth_type_code: str = Field(max_length=32)
    param_or_header_name: str | None = Field(default=None, max_length=64)
    secret_env_name: str | None = Field(default=None, max_length=100)
    secret_ciphertext: str | None = Field(default=None, max_length=4000)
    # The second secret of a pair (BASIC: the user; OAuth2: the client id), sealed under
    # the same key as the first (``encryption_key_id``).
    principal_env_name: str | None = Field(default=None, max_length=100)
    principal_ciphertext: str | None = Field(default=None, max_length=4000)
    encryption_key_id: str | None = Field(default=None, max_length=64)
    # OAuth2: how the client authenticates at the token endpoint (CLIENT_SECRET_BASIC |
    # CLIENT_SECRET_POST | NONE).
    token_auth_method_code: str | None = Field(default=None, max_length=32)
    # OAUTH2_REFRESH_TOKEN: the client secret of a confidential client (its refresh token
    # is the secret), sealed under the row's key like the others.
    client_secret_env_name: str | None = Field(default=None, max_length=100)
    client_secret_ciphertext: str | None = Field(default=None, max_length=4000)
    # SESSION_TOKEN: where the login's answer holds the session token.
    token_jsonpath: str | None = Field(default=None, max_length=200)
    is_default_preferred: bool = False
    lifecycle_status_code: str = Field(default="ACTIVE", max_length=16)
    deleted: bool = False


class RegProvTokenState(SQLModel, table=True):
    """The live tokens of an ``OAUTH2_REFRESH_TOKEN`` credential, next to its dated row:
    the refresh token in force (the row's ``secret_ciphertext`` is the one it was issued
    with; a server that rotates it on every use makes that one worthless after the first
    refresh) and the access token last issued, both sealed by the vault under
    ``encryption_key_id`` (``rotate-key`` moves them). ``version`` counts the refreshes:
    a write names the version it read, so a refresh that lost its lock writes nothing.
    The access token's times are epoch seconds on the database's clock, which every
    worker shares. A new refresh token imported into the row (``secret_env``) drops its
    state: the next refresh starts from it."""

    __tablename__ = "reg_prov_token_state"
    __table_args__ = (Index("uq_reg_prov_token_state_credential", "credential_id", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    credential_id: int = Field(
        sa_column=Column(
            Integer,
            ForeignKey("reg_prov_credential.id", ondelete="CASCADE"),
            nullable=False,
        )
    )
    version: int = 0
    refresh_token_ciphertext: str = Field(sa_column=Column(Text, nullable=False))
    access_token_ciphertext: str | None = Field(default=None, sa_column=Column(Text))
    encryption_key_id: str | None = Field(default=None, max_length=64)
    # A digest of how the access token was asked for (token URL, body, query, headers,
    # the source's origin; no secret): another contract's request is another token.
    access_shape: str | None = Field(default=None, max_length=64)
    access_renew_at: float | None = Field(default=None, sa_column=Column(Float))
    access_expires_at: float | None = Field(default=None, sa_column=Column(Float))
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RegProvWatermark(SQLModel, table=True):
    """Incremental pointer per (provenance, task type, key): advanced only on success."""

    __tablename__ = "reg_prov_watermark"
    __table_args__ = (
        Index("uq_reg_prov_watermark", "provenance_id", "task_type", "watermark_key", unique=True),
    )

    id: int | None = Field(default=None, primary_key=True)
    provenance_id: int = Field(foreign_key="reg_provenance.id")
    task_type: str = Field(max_length=16)
    watermark_key: str = Field(default="default", max_length=200)
    watermark_value: datetime = Field(sa_type=UTCDateTime)
    # An ID or COMPOSITE pointer taken from the records (JSON: the id, or [instant, id]).
    watermark_cursor: str | None = Field(default=None, max_length=500)
    last_run_id: str | None = Field(default=None, max_length=200)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RegProvWatermarkSeen(SQLModel, table=True):
    """The largest pointer value a running update has seen in its records, one row per
    processed batch (a retried batch adds a row; the maximum is the same). The run's end
    takes the maximum into ``reg_prov_watermark`` and removes its rows."""

    __tablename__ = "reg_prov_watermark_seen"
    __table_args__ = (Index("ix_reg_prov_watermark_seen_run", "provenance_id", "run_id"),)

    id: int | None = Field(default=None, primary_key=True)
    provenance_id: int = Field(foreign_key="reg_provenance.id")
    run_id: str = Field(max_length=200)
    watermark_key: str = Field(default="default", max_length=200)
    seen_value: str = Field(max_length=500)  # JSON: an instant, an id, or [instant, id]
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RegFrozenContract(SQLModel, table=True):
    """A run's frozen execution contract, stored once by its content's digest: a backfill's
    window runs (and a split's pieces) carry the digest instead of the contract, so
    starting thousands of them puts no contract into the parent's history
    (artemis/registry/frozen.py). ``touched_at``: when a run last asked for it (the
    cleanup removes the ones nobody asked for in ``runs.frozen_contract_days``)."""

    __tablename__ = "reg_frozen_contract"

    digest: str = Field(primary_key=True, max_length=80)
    body_json: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    touched_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


DIMENSIONS: dict[str, type[DimensionBase]] = {
    cls.dimension: cls
    for cls in (
        RegProvEndpointDef,
        RegProvWindowOffsetCfg,
        RegProvPaginationCfg,
        RegProvHttpCfg,
        RegProvBatchingCfg,
        RegProvRetryCfg,
        RegProvRateLimitCfg,
        RegProvRecordModel,
        RegProvCredential,
    )
}
TABLES: dict[str, type[DimensionBase]] = {cls.__tablename__: cls for cls in DIMENSIONS.values()}  # type: ignore[misc]
