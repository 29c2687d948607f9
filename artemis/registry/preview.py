"""A source previewed (``artemis registry preview``, ``POST /registry/preview``): its first
pages fetched through the same contract client, credentials, rate gate and paging as a
run, judged by the same record model and steps, and nothing written: no record lands, no
quarantine row, no drift row, no pointer.

What it tells: each request made (method and URL, never a credential), the records found,
whether paging would go on (the next request) or why it ends, the total the source
states, the records the model would set aside and why, the fields it does not name, and
a record model drafted from the sample (``artemis.registry.drafting``).

A file is previewed as if it were the registry's only provenance: its rows are imported
into a scratch registry in memory and resolved there as a run would resolve them, and its
credentials' secrets are read from this process's environment when a request needs them
(never sealed, never printed). A sub-resource is asked with the first record of its
parent resource's first page (or the next one, when that record has none of it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import StaticPool
from sqlmodel import SQLModel

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Answer, HttpClient
from artemis.paging import (
    CursorPaginator,
    LinkHeaderPaginator,
    NextUrlPaginator,
    Paginator,
    SinglePaginator,
    TokenPaginator,
)
from artemis.quarantine.judging import Judged, Rules, example_text, judge, model_faults
from artemis.quarantine.policy import RecordPolicy, Stage
from artemis.redact import register_secret
from artemis.registry import yaml_io
from artemis.registry.auth import Credentials
from artemis.registry.client import ContractClient, Sending
from artemis.registry.drafting import draft_model, draft_yaml
from artemis.registry.models import DIMENSIONS, RegProvenance
from artemis.registry.resolve import Contract, resolve_contract
from artemis.registry.rest_source import rest_source
from artemis.registry.secret_env import check_secret_env
from artemis.registry.tree import adopted, for_parent, resource_contract, resource_problems
from artemis.sinks.records import RecordSpec
from artemis.sources.base import Page, Source
from artemis.sources.rest import describe_request
from artemis.tasks.base import TaskContext
from artemis.tasks.source_harvest import SourceHarvest, SourceParams, record_model_row
from artemis.tracing import TraceContext, new_span_id, new_trace_id

# The most pages a preview asks: a look at the source, not a harvest.
MAX_PAGES = 10
# The most parent records a sub-resource's preview tries before it shows an empty answer.
MAX_PARENTS = 5
# Credentials whose secrets a file's preview reads from the environment: the ones that
# keep no state of their own in the registry between requests (a refresh token does).
_ENV_CREDENTIALS = (
    "API_KEY_QUERY",
    "API_KEY_HEADER",
    "BEARER",
    "BASIC",
    "OAUTH2_CLIENT_CREDENTIALS",
    "SESSION_TOKEN",
)
# The record model row's columns a drafted row keeps as they are in force.
_KEPT_COLUMNS = (
    "on_bad_record_code",
    "max_bad_records_value",
    "schema_contract_code",
    "coerce_types_enabled",
    "record_steps_json",
)


# -- the contract -----------------------------------------------------------------------------
def registry_contract(engine: sa.Engine, code: str) -> Contract:
    """The contract a harvest of provenance ``code`` would resolve now."""
    with engine.connect() as conn:
        return resolve_contract(conn, code, "harvest", datetime.now(UTC))


def file_contract(text: str, source: str) -> Contract:
    """The contract a harvest of the provenance in registry file ``text`` would resolve
    now, were the file imported into an empty registry (refused as the import refuses
    it). The registry is not written: the rows go to a scratch database in memory."""
    data = yaml_io._load(text, source)
    for i, row in enumerate(data.get("credential") or []):
        kind = row.get("auth_type_code")
        if kind not in _ENV_CREDENTIALS:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{source}: credential[{i}]: a file's preview reads the secrets of "
                f"{', '.join(_ENV_CREDENTIALS)} credentials from the environment; a {kind} "
                "credential keeps state in the registry: import the file and preview the "
                "provenance by its code",
            )
    engine = sa.create_engine("sqlite://", poolclass=StaticPool)
    try:
        models: list[Any] = [RegProvenance, *DIMENSIONS.values()]
        SQLModel.metadata.create_all(engine, tables=[m.__table__ for m in models])
        with engine.begin() as conn:
            yaml_io._import(conn, data, _Unsealed(), source)
            code = data["provenance"]["provenance_code"]
            contract = resolve_contract(conn, code, "harvest", datetime.now(UTC))
    finally:
        engine.dispose()
    # Ids of the scratch registry, kept apart from the registry's own (a key benched by
    # id in this process must never be another provenance's).
    rows = [{**c, "id": -int(c["id"])} for c in contract.credentials]
    return dataclasses.replace(contract, credentials=rows)


class _Unsealed(yaml_io.CredentialBox):
    """The scratch import's box: nothing is sealed; a secret is read from the environment
    again when a request needs it (``_EnvCredentials``)."""

    def __init__(self) -> None:
        pass

    def seal(self, secret: str) -> tuple[str, str]:
        return "(read from the environment)", ""


class _EnvCredentials(Credentials):
    """A file's credentials: each secret read from the variable the file names, in this
    process's environment, under the import's rules for those variables."""

    def _secret(self, cred_id: int, column: str = "secret_ciphertext") -> str:
        row = next((c for c in self.contract.credentials if c.get("id") == cred_id), {})
        env = row.get(column.removesuffix("_ciphertext") + "_env_name")
        name = row.get("credential_name")
        check_secret_env(env, ErrorCode.CONFIG_ERROR, f"credential {name!r}")
        value = os.environ.get(str(env or ""))
        if not env or not value:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"credential {name!r}: environment variable {env} is not set",
                retryable=False,
            )
        register_secret(value)
        return value


# -- the preview ------------------------------------------------------------------------------
class _Calls:
    """Every request the preview sends, as ``describe_request`` writes it (credentials
    are added past this point, so never part of it), with its answer's status."""

    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []
        self.resource: str | None = None

    def watch(self, cc: ContractClient) -> None:
        send = cc.send

        async def recorded(
            client: HttpClient,
            method: str,
            url: str,
            params: dict[str, Any],
            what: str,
            how: Sending | None = None,
        ) -> Answer:
            line = describe_request(url, params).replace("GET ", f"{method} ", 1)
            if how is not None and how.body is not None:
                line += " " + json.dumps(how.body, sort_keys=True, default=str)
            call: dict[str, Any] = {"resource": self.resource, "request": line, "status": None}
            self.made.append(call)
            started = time.monotonic()
            try:
                resp = await send(client, method, url, params, what, how)
            except ArtemisError as e:
                call["status"] = e.details.get("status")
                call["error"] = e.code.value
                raise
            finally:
                call["millis"] = round((time.monotonic() - started) * 1000, 1)
            call["status"] = resp.status_code
            return resp

        # Per instance: the copies made for each resource (``for_contract``) record too.
        cc.send = recorded  # type: ignore[method-assign]
        cc.credentials.on_token_request = self.token

    def token(self, request: str, status: int | None, millis: float) -> None:
        """A token request (a login, a refresh): its URL, never its form or body."""
        line = f"{request} (token request; its form is not shown)"
        call = {"resource": self.resource, "request": line, "status": status, "millis": millis}
        # Listed before the request that waited for it (the first still in flight).
        waiting = [i for i, c in enumerate(self.made) if "millis" not in c]
        self.made.insert(waiting[0] if waiting else len(self.made), call)


@dataclasses.dataclass
class _Run:
    """What one preview works with: the contract, its client and the task's judge."""

    contract: Contract
    cc: ContractClient
    client: HttpClient
    calls: _Calls
    task: SourceHarvest
    ctx: TaskContext


async def preview(
    contract: Contract,
    settings: Settings,
    client: HttpClient,
    *,
    resource: str | None = None,
    pages: int = 2,
    secrets_from_env: bool = False,
) -> dict[str, Any]:
    """The first ``pages`` pages of ``contract``'s resource (default: its only or root
    one) and what a run would make of them (see the module). ``secrets_from_env``: a
    file's contract (``file_contract``), its secrets read from the environment."""
    pages = max(1, min(pages, MAX_PAGES))
    name = _resource_of(contract, resource)
    run = _start(contract, settings, client, name, secrets_from_env)
    source, fetched, parent = await _fetched(run, name, pages)
    raws = [_adopted(run, name, parent, p.records) for p in fetched]
    report = _judged(run, raws)
    records = [r for raw in raws for r in raw]
    report.update(
        provenance=run.cc.code,
        resource=name,
        source="file" if secrets_from_env else "registry",
        requests=run.calls.made,
        parent=None
        if parent is None
        else {"resource": _parent_of(contract, name), "record": parent},
        pages=[_page_line(p, len(raw)) for p, raw in zip(fetched, raws, strict=True)],
        records=records,
        paging=paging_state(source, fetched, pages),
        stated_total=fetched[-1].info.expected_total if fetched else None,
    )
    report.update(_drafted(run, name, report.pop("shaped")))
    return report


def _resource_of(contract: Contract, asked: str | None) -> str | None:
    """The resource previewed: the one asked, else the provenance's only or root one."""
    code = contract.provenance.get("provenance_code")
    resources = contract.resources or {}
    if not resources:
        if asked is not None:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"resource: provenance {code!r} is one resource (its file names no "
                "resource_name): leave resource out",
            )
        return None
    if asked is not None:
        if asked not in resources:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"resource: {asked!r} is not a resource of provenance {code!r} "
                f"(resources: {', '.join(resources)})",
            )
        return asked
    roots = [n for n, r in resources.items() if not r.get("parent")]
    if len(roots) != 1:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"resource: provenance {code!r} has the root resources {', '.join(roots)}: "
            "name the one to preview",
        )
    return roots[0]


def _start(
    contract: Contract,
    settings: Settings,
    client: HttpClient,
    name: str | None,
    secrets_from_env: bool,
) -> _Run:
    """The preview's client and judge, after the checks a run makes before it asks."""
    code = contract.provenance.get("provenance_code")
    task = SourceHarvest()
    task.check_provenance(contract)
    problems = resource_problems(contract)
    if not contract.resources and contract.endpoint is None:
        problems.append("no SEARCH endpoint in force")
    if problems:
        raise ArtemisError(ErrorCode.CONFIG_ERROR, f"provenance {code!r}: {'; '.join(problems)}")
    params = SourceParams(
        provenance=str(code), contract=contract.to_dict(), resource=name, only=name is not None
    )
    task.record_spec(params)  # a model or steps written around the import: CONFIG_ERROR
    task.record_steps(params)
    cc = ContractClient(contract, settings)
    if secrets_from_env:
        cc.credentials = _EnvCredentials(contract, settings, cc.reach())
    calls = _Calls()
    calls.watch(cc)
    trace = TraceContext(new_trace_id(), new_span_id())
    # Read as an operator's run reads its policy (evolve stays evolve); a harvest with
    # no window notes no pointer, and judging writes nothing.
    ctx = TaskContext("source_harvest", "preview", params, settings, trace, role="operator")
    return _Run(contract, cc, client, calls, task, ctx)


def _parent_of(contract: Contract, name: str | None) -> str | None:
    return ((contract.resources or {}).get(name or "") or {}).get("parent")


async def _candidates(run: _Run, name: str) -> list[dict[str, Any] | None]:
    """The parent records resource ``name`` may be asked for: none for a root resource;
    for a sub-resource the first ``MAX_PARENTS`` records of its parent's first page, that
    parent asked for the first of its own candidates that answers any record (a
    repository listed and gone answers no issue: the next one is asked)."""
    parent = _parent_of(run.contract, name)
    if not parent:
        return [None]
    for above in await _candidates(run, parent):
        run.calls.resource = parent
        fetched = await first_pages(_resource_source(run, parent, above), run.client, 1)
        records = _adopted(run, parent, above, fetched[0].records if fetched else [])
        found = [r for r in records if isinstance(r, dict)]
        if found:
            return list(found[:MAX_PARENTS])
    raise ArtemisError(
        ErrorCode.SOURCE_CONTRACT,
        f"resource {name!r}: its parent resource {parent!r} answered no record on its "
        f"first page: no values to ask {name!r} with",
    )


async def _fetched(
    run: _Run, name: str | None, pages: int
) -> tuple[Source, list[Page], dict[str, Any] | None]:
    """The resource's first pages, with the parent record they were asked for: the first
    candidate whose first page holds a record (else the last one asked)."""
    candidates = await _candidates(run, name) if name else [None]
    run.calls.resource = name
    for i, parent in enumerate(candidates):
        source = _resource_source(run, name, parent)
        fetched = await first_pages(source, run.client, pages)
        if i == len(candidates) - 1 or any(p.records for p in fetched):
            break
    return source, fetched, parent


def _resource_source(run: _Run, name: str | None, parent: dict[str, Any] | None) -> Source:
    """The source of one resource as a run opens it (``SourceHarvest._tree_source``): no
    query, no window, one request at a time."""
    own = resource_contract(run.contract, name) if name else run.contract
    if parent is not None and name:
        endpoint = for_parent(own.endpoint or {}, parent, name)
        own = dataclasses.replace(
            own, endpoint=endpoint, endpoints={**own.endpoints, "SEARCH": endpoint}
        )
    return rest_source(run.cc.for_contract(own), None, {}, None, 1)


def _adopted(
    run: _Run, name: str | None, parent: dict[str, Any] | None, records: list[Any]
) -> list[Any]:
    """A sub-resource's records with the fields it copies from its parent record."""
    if parent is None or not name:
        return list(records)
    res = (run.contract.resources or {})[name]
    return [adopted(res, parent, r) for r in records]


async def first_pages(source: Source, client: HttpClient, count: int) -> list[Page]:
    """At most ``count`` pages of ``source`` (fewer when paging ends first)."""
    out: list[Page] = []
    pages = source.pages(client, None)
    try:
        async for page in pages:
            out.append(page)
            if len(out) >= count or page.checkpoint is None:
                break
    finally:
        close = getattr(pages, "aclose", None)
        if close is not None:
            await close()
    return out


def _page_line(page: Page, records: int) -> dict[str, Any]:
    return {
        "request": page.info.request,
        "records": records,
        "stated_total": page.info.expected_total,
        "taken": page.info.taken,
        "ignored": page.info.ignored,
    }


# -- paging -----------------------------------------------------------------------------------
def paging_state(source: Source, fetched: list[Page], asked: int) -> dict[str, Any]:
    """Whether paging goes on after the pages fetched (and the request that comes next),
    or why it ends, by the paginator's state after the last one."""
    search: Any = getattr(source, "search", source)  # a DETAIL source pages its search
    paginator: Paginator | None = getattr(search, "paginator", None)
    last = fetched[-1] if fetched else None
    if last is not None and last.checkpoint is not None and paginator is not None:
        nxt = search.build_request(paginator).describe()
        return {
            "goes_on": True,
            "next_request": nxt,
            "why": f"the preview stops after {asked} page(s); a run asks next: {nxt}",
        }
    return {"goes_on": False, "next_request": None, "why": end_reason(paginator, last)}


def end_reason(paginator: Paginator | None, last: Page | None) -> str:
    """Why paging ended on ``last``, in the words of docs/registry.md's end markers."""
    if last is None or paginator is None:
        return "no page was answered"
    if last.info.ignored:
        return "the answer matched a response rule that ignores it (response_actions_json)"
    if paginator.total is not None and paginator.taken >= paginator.total:
        return f"the stated total ({paginator.total}) is reached"
    if isinstance(paginator, SinglePaginator):
        return "one request (SINGLE): the answer holds every record"
    if not last.records:
        return "an empty page"
    size = getattr(paginator, "page_size", None) or getattr(paginator, "limit", None)
    if getattr(paginator, "short_page_ends", False) and size and len(last.records) < size:
        return f"a short page ({len(last.records)} records of {size}: short_page_is_last)"
    return _marker_end(paginator)


def _marker_end(paginator: Paginator) -> str:
    if isinstance(paginator, CursorPaginator):
        return f"no next cursor at {paginator.cursor_path}"
    if isinstance(paginator, TokenPaginator):
        return f"no next page token at {paginator.token_path}"
    if isinstance(paginator, LinkHeaderPaginator):
        return 'no rel="next" link in the Link header'
    if isinstance(paginator, NextUrlPaginator):
        return f"no next URL at {paginator.next_url_path}"
    marker = getattr(paginator, "has_more_path", None) or getattr(paginator, "next_page_path", None)
    marker = marker or getattr(paginator, "next_offset_path", None)
    if marker:
        return f"the source's end marker at {marker} says this page is the last"
    return "the source's answer ends the paging"


# -- what a run would make of the records ------------------------------------------------------
def _judged(run: _Run, raws: list[list[Any]]) -> dict[str, Any]:
    """Each page through the task's steps and the record model's check, as a run judges
    it, with the run's policy read but nothing kept: the records it would set aside and
    why, the fields the model does not name, and what would stop the run."""
    task, ctx = run.task, run.ctx
    spec = task.record_spec(ctx.params)
    policy = task.record_policy(ctx)
    # Everything is reported, nothing raised: a run's ``fail`` or ``freeze`` is told.
    looking = dataclasses.replace(policy, on_bad_record="quarantine", schema_contract="discard")
    out: dict[str, Any] = {
        "model": _model(run),
        "policy": dataclasses.asdict(policy),
        "set_aside": [],
        "not_named": {},
        "missing": set(),
        "stops": [],
        "shaped": [],
    }
    for seq, raw in enumerate(raws):
        shaped = _shaped(task, ctx, raw)
        out["shaped"] += shaped
        try:
            judged = judge(task, ctx, seq, raw, Rules(looking, spec))
        except ArtemisError as e:  # every record of the page breaks one rule
            out["stops"].append(e.message)
            out["set_aside"] += _faults(spec, shaped, seq)
            continue
        _note(out, judged, seq)
    out["not_named"] = list(out["not_named"].values())
    out["missing"] = sorted(out["missing"])
    out["stops"] += _policy_stops(policy, out)
    return out


def _model_row(run: _Run) -> dict[str, Any]:
    """The record model row in force for the resource previewed (empty: none)."""
    name = run.ctx.params.resource  # type: ignore[attr-defined]
    own = resource_contract(run.contract, name) if name else run.contract
    return record_model_row(own.to_dict()) or {}


def _model(run: _Run) -> dict[str, Any] | None:
    row = _model_row(run)
    if row.get("fields_json") is None:
        return None
    return {"key": row.get("key_json"), "fields": row["fields_json"]}


def _shaped(task: SourceHarvest, ctx: TaskContext, raw: list[Any]) -> list[dict[str, Any]]:
    """The records as the model's steps shape them (those a step rejects or filters out
    left out): what the model sees, and what a model is drafted from."""
    ctx.rejected, ctx.filtered = [], 0
    shaped = task.process(list(raw), ctx)
    ctx.rejected, ctx.filtered = [], 0
    return shaped


def _faults(spec: RecordSpec | None, shaped: list[dict[str, Any]], seq: int) -> list[dict]:
    if spec is None:
        return []
    names = spec.model.model_fields
    named = [{k: v for k, v in r.items() if k in names} for r in shaped]
    return [
        {
            "page": seq,
            "position": i,
            "key": {k: shaped[i].get(k) for k in spec.key},
            "field": f.field,
            "reason": f"record {f.problem}",
        }
        for i, f in sorted(model_faults(spec, named).items())
    ]


def _note(out: dict[str, Any], judged: Judged, seq: int) -> None:
    for bad in judged.bad:
        out["set_aside"].append(
            {
                "page": seq,
                "position": bad.position if bad.stage == Stage.PROCESS else None,
                "key": bad.key,
                "field": bad.field,
                "reason": bad.message,
            }
        )
    for drift in judged.drift:
        if drift.kind == "missing":
            out["missing"].add(drift.field)
        elif drift.field not in out["not_named"]:
            out["not_named"][drift.field] = {
                "field": drift.field,
                "type": drift.type_name,
                "example": example_text(drift.example),
            }


def _policy_stops(policy: RecordPolicy, out: dict[str, Any]) -> list[str]:
    """What the run's own policy would do with what the preview found."""
    stops = []
    if out["set_aside"] and not policy.quarantines:
        stops.append("on_bad_record is FAIL: the first record set aside fails the run")
    if out["not_named"] and policy.schema_contract == "freeze":
        field = out["not_named"][0]["field"]
        stops.append(f"schema_contract is FREEZE: field {field!r} fails the run")
    return stops


def _drafted(run: _Run, name: str | None, shaped: list[dict[str, Any]]) -> dict[str, Any]:
    """A record model drafted from the records as shaped, as a ``record_model`` row that
    replaces the one in force when pasted (same scope, task type and start), keeping its
    steps and policy."""
    try:
        draft = draft_model(shaped)
    except ValueError as e:
        return {"drafted_model": None, "drafted_yaml": None, "draft_problem": str(e)}
    row = _model_row(run)
    place: dict[str, Any] = {}
    if row.get("effective_from"):
        place = {
            "scope": row.get("scope_code") or "SOURCE",
            "task_type": row.get("task_type"),
            "effective_from": _iso(row["effective_from"]),
        }
    kept = {c: row[c] for c in _KEPT_COLUMNS if row.get(c) is not None}
    text = draft_yaml(draft, resource=name, extra=kept, **place)
    return {"drafted_model": draft, "drafted_yaml": text, "draft_problem": None}


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        value = value.isoformat()
    return str(value).replace("+00:00", "Z")
