"""Artemis settings: a YAML file (``--config`` / ``ARTEMIS_CONFIG``) overlaid by
environment variables ``ARTEMIS__SECTION__KEY``; a bad value stops start-up naming the key."""

from __future__ import annotations

import contextvars
import dataclasses
import ipaddress
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from artemis.errors import ArtemisError, ErrorCode, describe_fields, validation_fields
from artemis.owners import DEFAULT_OWNER
from artemis.run_models import RunTuning
from artemis.schedules import ScheduleDef

# The YAML file of the settings being loaded (pydantic-settings' own YAML source reads it).
_YAML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "artemis_yaml_file", default=None
)


class _Section(BaseModel):
    # Unknown keys are refused so that a typo in the YAML is caught, not ignored.
    model_config = ConfigDict(extra="forbid")


# Who may call the API, and what they may do (docs/security.md): a `client` starts runs
# and reads and controls its own; an `operator` reads and controls every run; an `admin`
# also decrypts payloads (the codec route) and manages the registry and cookies.
Role = Literal["client", "operator", "admin"]
ROLES: tuple[str, ...] = ("client", "operator", "admin")


class ApiToken(_Section):
    """A named API token. The name owns the runs the token starts (their task ids read
    ``{name}~{id}``) and is what the Temporal UI filters by; the token itself comes from
    the environment (``ARTEMIS__SERVER__API_TOKENS``) or a file outside the repo."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,31}$")]
    token: str
    role: Role = "client"

    @field_validator("name")
    @classmethod
    def _not_default(cls, v: str) -> str:
        if v == DEFAULT_OWNER:
            raise ValueError(f"{DEFAULT_OWNER!r} is the owner of bare-string tokens' runs")
        return v


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    # Bare strings are admin tokens owned by "default"; mappings are named ApiTokens.
    api_tokens: list[str | ApiToken] = Field(default_factory=list)
    sync_timeout_s: float = Field(60.0, gt=0)
    max_body_bytes: int = Field(1_048_576, gt=0)
    # Wall-clock budget of one run; past it the run ends with status `timeout`.
    run_timeout_s: float = Field(3600.0, gt=0)
    public_url: str | None = None
    # How long an idle keep-alive connection stays open. Longer than the idle timeouts of
    # the clients and proxies in front (aiohttp 15 s, an AWS ALB or nginx 60 s): when the
    # server closes first, a client that sends on the connection at that moment gets
    # "server disconnected" for its POST (uvicorn's own default is 5 s).
    keep_alive_s: int = Field(75, gt=0)
    # Event streams (GET /tasks/{id}/events) one API process serves at once, per token
    # name and in all: each holds a connection and polls the event log until its run ends.
    sse_max_streams_per_token: int = Field(16, ge=1)
    sse_max_streams: int = Field(256, ge=1)
    # A stream ends cleanly after this long even while its run goes on; the client
    # reconnects with Last-Event-ID and gets the events after it.
    sse_max_lifetime_s: float = Field(3600.0, gt=0, allow_inf_nan=False)

    @field_validator("api_tokens")
    @classmethod
    def _tokens(cls, v: list[str | ApiToken]) -> list[str | ApiToken]:
        # An unfilled template (`[""]`) must not read as "tokens configured": an empty
        # token would let a request without Authorization through.
        names: set[str] = set()
        values: set[str] = set()
        for n, entry in enumerate(v):
            token = entry if isinstance(entry, str) else entry.token
            if not token or not token.strip():
                raise ValueError(f"token #{n + 1} is empty: remove it or give it a value")
            if token != token.strip():
                raise ValueError(f"token #{n + 1} has leading or trailing whitespace")
            if token in values:
                raise ValueError(f"token #{n + 1} is listed twice")
            values.add(token)
            if isinstance(entry, ApiToken):
                if entry.name in names:
                    raise ValueError(f"token #{n + 1}: the name {entry.name!r} is taken")
                names.add(entry.name)
        return v

    def tokens(self) -> list[ApiToken]:
        """Every configured token as an ApiToken (a bare string: admin, owner "default")."""
        return [
            ApiToken.model_construct(name=DEFAULT_OWNER, token=t, role="admin")
            if isinstance(t, str)
            else t
            for t in self.api_tokens
        ]


class LogFileSettings(_Section):
    path: str = "logs/artemis.log"
    max_size_mb: int = Field(50, gt=0)
    max_backups: int = Field(5, ge=0)
    max_age_days: int = Field(7, ge=0)


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARN", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] = "json"
    output: Literal["stdout", "stderr", "file"] = "stderr"
    file: LogFileSettings = Field(default_factory=LogFileSettings)
    include_caller: bool = True

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


class TelemetrySettings(_Section):
    enabled: bool = True
    service_name: str = "artemis"
    sampling: Literal["always", "never", "ratio"] = "always"
    sampling_ratio: float = Field(1.0, ge=0, le=1)
    exporter: Literal["none", "console", "otlp"] = "none"
    otlp_endpoint: str | None = None


class TemporalTLS(_Section):
    enabled: bool = False
    server_root_ca_cert: str | None = None
    client_cert: str | None = None
    client_private_key: str | None = None
    domain: str | None = None


class TemporalSettings(_Section):
    address: str = "127.0.0.1:7233"
    namespace: str = "default"
    task_queue: str = "artemis"
    # The Worker Deployment the workers poll as (artemis/temporal/versioning.py): one
    # per task queue unless named. No '.' in it.
    deployment_name: str | None = None
    tls: TemporalTLS = Field(default_factory=TemporalTLS)
    api_key: str | None = None
    payload_encryption: bool = False
    ui_url: str = "http://127.0.0.1:8233"


class DatabaseSettings(_Section):
    url: str = "sqlite:///.artemis/artemis.db"


class TaskStoreSettings(_Section):
    backend: Literal["sql", "redis"] = "sql"
    redis_url: str = "redis://127.0.0.1:6379/0"
    ttl_hours: int = Field(24, gt=0)
    # How often the worker's clean-up loop removes terminal tasks older than ttl_hours.
    cleanup_interval_minutes: float = Field(60, gt=0)


class HttpClientSettings(_Section):
    timeout_seconds: float = Field(10.0, gt=0)
    verify_ssl: bool = True
    headers: dict[str, str] = Field(default_factory=dict)
    max_connections: int = Field(100, gt=0)
    # The largest answer a worker reads (sources, sinks, callbacks), counted after
    # decompression: past it the request fails for good, the worker's memory stays
    # bounded (a provenance may set its own: http_cfg.max_body_bytes).
    max_body_bytes: int = Field(64 * 1024 * 1024, gt=0)


class CallbackSettings(_Section):
    # The CronJob's own base URL: a request's run_id without a base URL calls it, and
    # default_token is sent to its origin only (a request may name other allowed hosts).
    base_url: str | None = None
    override_host: str | None = None
    override_port: int | None = Field(None, ge=1, le=65535)
    default_auth_header: str = "X-Callback-Token"
    default_token: str | None = None
    # The hosts a request's callback URL may name (docs/security.md): its own list, so a
    # host allowed for sources or sinks does not receive callbacks; default: the host of
    # base_url, else security.allowed_hosts.
    allowed_hosts: list[str] | None = None
    progress_min_interval_ms: int = Field(1000, ge=0)
    timeout_seconds: float = Field(2.0, gt=0)


class EventSettings(_Section):
    """The per-run event stream (docs/architecture.md): what activities record, how the API
    tails it."""

    # Fetch progress is recorded at most this often per run (the last page always is).
    progress_min_interval_ms: int = Field(500, ge=0)
    # How often an open SSE stream looks for new events.
    poll_interval_ms: int = Field(200, ge=10)
    # An SSE comment line this often keeps proxies from closing an idle stream.
    keepalive_s: float = Field(15.0, gt=0)


class QuarantineSettings(_Section):
    """Records a run set aside (artemis/quarantine/): how long they are kept, how large
    one may be."""

    # Quarantined records (replayed, discarded or not) are deleted after this many days.
    retain_days: float = Field(30.0, gt=0)
    # A record larger than this (as JSON) is kept with its reason but not its body.
    max_record_bytes: int = Field(1_048_576, ge=1024)
    # The most a request's (or task_defaults') ``max_bad_records`` may allow: a count up
    # to ``max_bad_records_cap_count``, a percentage up to ``max_bad_records_cap_pct``
    # (a request past either is a 422 naming it; the registry's own value is not capped).
    max_bad_records_cap_count: int = Field(100_000, ge=0)
    max_bad_records_cap_pct: float = Field(10.0, ge=0, le=100, allow_inf_nan=False)


class SchemaSettings(_Section):
    """Record models that grow (``schema_contract: evolve``, artemis/registry/evolve.py)."""

    # The most new fields one run adds to a provenance's record model; the rest are
    # skipped and reported in the run's schema_drift events.
    max_new_fields: int = Field(50, ge=0, le=1000)


class MetricsSettings(_Section):
    """Prometheus. The API serves GET /metrics; a separate worker process serves its own
    registry on ``worker_port``; the Temporal SDK's worker metrics on ``sdk_port``."""

    enabled: bool = True
    host: str = "127.0.0.1"
    worker_port: int | None = Field(None, ge=1, le=65535)
    sdk_port: int | None = Field(None, ge=1, le=65535)


class PlatformSettings(_Section):
    """A note platform spoken to by the generic HTTP JSON adapter."""

    base_url: str
    search_path: str = "/search"
    detail_path: str = "/notes/{note_id}"
    keyword_param: str = "keyword"
    page_param: str = "page"
    page_size_param: str = "page_size"
    page_size: int = Field(10, ge=1, le=200)
    items_path: str = "items"
    # Where the search answer says what comes next (the sample platform's ``next_page``,
    # a number or null on the last page); or, for a platform that answers a flag, ``has_more_path``
    # with ``next_page_path: null``. A missing key is SOURCE_CONTRACT, never an end.
    next_page_path: str | None = "next_page"
    has_more_path: str | None = None
    note_id_field: str = "note_id"
    note_url_field: str = "note_url"
    cookie_header: str = "Cookie"
    search_needs_cookie: bool = True

    @model_validator(mode="after")
    def _next_marker(self) -> PlatformSettings:
        if self.has_more_path and "next_page_path" not in self.model_fields_set:
            self.next_page_path = None  # a configured flag wins over the default marker
        if self.has_more_path and self.next_page_path:
            raise ValueError("set one of next_page_path and has_more_path, not both")
        if not self.next_page_path and not self.has_more_path:
            raise ValueError(
                "set next_page_path (a next page number, null on the last page) or "
                "has_more_path (a true/false flag): a search must end on the platform's word"
            )
        return self


class CrawlerSettings(_Section):
    """The crawler's constants (docs/operations.md) and the platforms crawl_notes can reach."""

    lock_timeout_minutes: float = Field(30, gt=0)
    recovery_interval_minutes: float = Field(15, gt=0)
    cooling_duration_minutes: float = Field(30, gt=0)
    max_consecutive_errors: int = Field(3, ge=1)
    max_total_errors: int = Field(10, ge=1)
    search_timeout_s: float = Field(30, gt=0)
    detail_timeout_s: float = Field(15, gt=0)
    batch_timeout_s: float = Field(60, gt=0)
    max_retry: int = Field(3, ge=1)
    backoff_s: list[float] = Field(default_factory=lambda: [5.0, 15.0, 45.0])
    batch_size: int = Field(10, ge=1, le=500)
    # The note platforms crawled, by name (the embedded stack sets its sample platform).
    platforms: dict[str, PlatformSettings] = Field(default_factory=dict)


class AlertSettings(_Section):
    """The three crawler alerts (docs/operations.md), evaluated every ``interval_s`` by the workers'
    alerts loop (workflows/alerts.py); ``enabled: false`` stops the loop at the next start."""

    enabled: bool = True
    webhook_url: str | None = None
    interval_s: float = Field(60, gt=0)
    success_rate_threshold: float = Field(0.9, gt=0, le=1)
    success_window_minutes: float = Field(10, gt=0)
    min_attempts: int = Field(10, ge=1)
    backlog_threshold: int = Field(500, ge=0)
    backlog_minutes: float = Field(30, ge=0)


@pydantic_dataclass(config=ConfigDict(extra="forbid"))
class RunsSettings(RunTuning):
    """The ``runs:`` section: the run's own tuning (``RunTuning``, carried in its history,
    where its fields, defaults and bounds are written) and the worker-side knobs below.
    A stdlib dataclass base keeps the history payload free of pydantic; this subclass
    validates it as a settings section."""

    # How many of a run's independent units (sources: symbols, keywords) fetch at once.
    fetch_concurrency: Annotated[int, Field(ge=1, le=64)] = 4
    # How many pages of a batch are being sent to the sinks at once.
    emit_concurrency: Annotated[int, Field(ge=1, le=64)] = 4
    # The share of a provenance's qps_limit its rate gate spaces requests by: a little
    # headroom keeps scheduling jitter (tens of ms) from putting qps + 1 requests into a
    # source's own sliding second (NCBI answers 429 then).
    rate_limit_headroom: Annotated[float, Field(gt=0.5, le=1.0)] = 0.95
    # How often a worker looks for new or re-rated provenances to poll (their own queues).
    provenance_refresh_s: Annotated[float, Field(gt=0)] = 30.0
    # The most windows one backfill may cut its range into (a start past it is refused,
    # naming the bound and the count): each window is a child run.
    max_windows: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000
    # A frozen contract no run asked for in this many days is removed by the cleanup
    # (artemis/registry/frozen.py).
    frozen_contract_days: Annotated[float, Field(gt=0)] = 30.0

    def run_tuning(self) -> RunTuning:
        """The run's part, for its history: a plain ``RunTuning`` (never this section,
        whose worker-side fields would enter the payload)."""
        return RunTuning(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RunTuning)})


class WorkerSettings(_Section):
    # On SIGTERM/SIGINT a worker stops polling, lets in-flight activities finish (a fetch
    # returns at its next page with its checkpoint) for this long, then exits 0.
    graceful_shutdown_s: float = Field(30.0, ge=0)
    # How often at most a running activity's heartbeat reaches Temporal. A pause (or a
    # cancel) reaches a fetch in flight with the answer to its next heartbeat, so this
    # bounds how long it goes on fetching: one heartbeat RPC a second per running fetch.
    # An attempt's first heartbeat is held back this long too (at most half the heartbeat
    # timeout; an attempt that ends sooner sends none: activities/run_base.py Heartbeat).
    heartbeat_throttle_s: float = Field(1.0, gt=0)
    # How often a worker checks that each housekeeping loop still runs (one that a worker
    # running other code ended during a rolling upgrade is started again; a retired
    # start-up schedule that such a worker re-created is deleted again).
    housekeeping_check_s: float = Field(300.0, gt=0)
    # Temporal's workflow sandbox for the runs this worker executes. Off by default: it
    # re-imports the workflow modules for every run and proxies every activation — 38 %
    # of a small run's worker CPU (docs/performance.md) — while what it guards
    # is checked before a build ships: every replay test runs the workflows in it (the
    # history corpus, tests/e2e/test_replay.py), and tests/unit/test_workflow_determinism.py
    # rejects non-deterministic calls and module state in workflows/. On: the sandbox
    # in production too.
    sandboxed_workflows: bool = False
    # The build this worker polls as. Unset: a digest of the code the workflows execute,
    # so that a run pinned to a build never meets changed workflow code. Set it (the image
    # tag, say) only to a value that changes whenever that code does.
    build_id: str | None = None


# Where the master key is read from when COOKIE_MASTER_KEY is not set (the embedded dev
# stack alone generates it there): the one default of ``vault.master_key_file`` and of
# ``artemis.vault``'s key-file arguments.
DEFAULT_MASTER_KEY_FILE = ".artemis/master.key"


class VaultSettings(_Section):
    """Secrets at rest (``artemis/vault.py``): run secrets, registry credentials, cookies
    and, with ``temporal.payload_encryption``, Temporal payloads."""

    # Dev only: production sets COOKIE_MASTER_KEY, which wins over the file.
    master_key_file: str = DEFAULT_MASTER_KEY_FILE


class SecuritySettings(_Section):
    # Hosts a URL from a request may name (source base URLs in params, sink endpoints in
    # output, callback URLs): exact names, IPs or CIDR networks, "*.example.com", "*" for
    # any; "host:port" allows that port only. An internal address (loopback, private,
    # link-local, reserved) is reached only through a literal IP or CIDR entry, checked
    # where the connection is made. The default: none (the embedded stack allows its
    # sample servers).
    allowed_hosts: list[str] = Field(default_factory=list)
    # A DNS server ("ip:port", "[v6]:port") to resolve request URLs' names with, instead
    # of the system's resolver (the API's check and the workers' connections ask the same
    # one). An IP literal: a name would have to be resolved by some other resolver first.
    dns_server: str | None = None

    @field_validator("dns_server")
    @classmethod
    def _dns_server(cls, v: str | None) -> str | None:
        if v is None:
            return v
        host, sep, port = v.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        try:
            ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
        except ValueError:
            ip = None
        if (
            not sep
            or ip is None
            or (ip.version == 6) != bracketed
            or not port.isdigit()
            or not 1 <= int(port) <= 65535
        ):
            raise ValueError(
                "security.dns_server: an IP address and port (1.2.3.4:53, [2001:db8::1]:53), "
                f"got {v!r}: a host name would need a resolver of its own"
            )
        return v


# The ``schema`` section's field shadows pydantic's deprecated ``BaseModel.schema()``
# (nothing calls it on settings): the section keeps the name the docs give it.
warnings.filterwarnings(
    "ignore", message='Field name "schema" in "Settings" shadows', category=UserWarning
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ARTEMIS__",
        env_nested_delimiter="__",
        extra="forbid",
        case_sensitive=False,
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    temporal: TemporalSettings = Field(default_factory=TemporalSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    task_store: TaskStoreSettings = Field(default_factory=TaskStoreSettings)
    http_client: HttpClientSettings = Field(default_factory=HttpClientSettings)
    # Per task code: params a request may leave out, and where its records go. Empty by
    # default: a run needs its source and its sinks named (by the request or here); the
    # embedded stack (`artemis dev`, `demo`) sets the sample servers'.
    task_defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    output_defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    callback: CallbackSettings = Field(default_factory=CallbackSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    runs: RunsSettings = Field(default_factory=RunsSettings)
    events: EventSettings = Field(default_factory=EventSettings)
    quarantine: QuarantineSettings = Field(default_factory=QuarantineSettings)
    schema: SchemaSettings = Field(default_factory=SchemaSettings)  # type: ignore[assignment]
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    vault: VaultSettings = Field(default_factory=VaultSettings)
    crawler: CrawlerSettings = Field(default_factory=CrawlerSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    # Task runs Temporal starts on a calendar, reconciled at every worker start
    # (artemis/schedules.py, docs/schedules.md).
    schedules: list[ScheduleDef] = Field(default_factory=list)

    @field_validator("schedules")
    @classmethod
    def _schedule_names(cls, v: list[ScheduleDef]) -> list[ScheduleDef]:
        names = [d.name for d in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"schedules: each name once ({', '.join(twice)} more than once)")
        return v

    def callback_hosts(self) -> list[str]:
        """The hosts a request's callback URL may name: ``callback.allowed_hosts``, else
        the host (and port) of ``callback.base_url``, else ``security.allowed_hosts``."""
        if self.callback.allowed_hosts is not None:
            return list(self.callback.allowed_hosts)
        if self.callback.base_url:
            from urllib.parse import urlsplit

            parts = urlsplit(self.callback.base_url)
            if parts.hostname:
                host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
                return [f"{host}:{parts.port}" if parts.port else parts.hostname]
        return list(self.security.allowed_hosts)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The order is the priority (docs/configuration.md): values given explicitly
        # (command-line flags, code) > ARTEMIS__… environment > the YAML file > defaults.
        # Sections merge key by key.
        path = _YAML_FILE.get()
        if path is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls, path))


def _format_validation_error(exc: ValidationError, source: str) -> str:
    return f"invalid configuration ({source}): " + describe_fields(validation_fields(exc.errors()))


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Load settings: ``overrides`` (command-line flags, explicit values) > ``ARTEMIS__…``
    environment > the YAML file ``path`` (or ``ARTEMIS_CONFIG``) > defaults.

    Raises ArtemisError(CONFIG_ERROR) with the offending key in the message.
    """
    path = path or os.environ.get("ARTEMIS_CONFIG")
    data: dict[str, Any] = {}
    source = "defaults and environment"
    if path:
        p = Path(path)
        if not p.is_file():
            raise ArtemisError(ErrorCode.CONFIG_ERROR, f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR, f"config file {p} is not valid YAML: {e}"
            ) from None
        if not isinstance(loaded, dict):
            raise ArtemisError(ErrorCode.CONFIG_ERROR, f"config file {p} must hold a mapping")
        data = loaded
        source = str(p)
    token = _YAML_FILE.set(Path(path) if path and data else None)
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise ArtemisError(ErrorCode.CONFIG_ERROR, _format_validation_error(e, source)) from None
    finally:
        _YAML_FILE.reset(token)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
