"""Resolution rules (docs/registry.md), example by example and against a reference
implementation in plain Python (hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert

from artemis.registry.models import (
    RegProvCredential,
    RegProvenance,
    RegProvEndpointDef,
    RegProvPaginationCfg,
)
from artemis.registry.resolve import (
    base_url,
    credentials_in_order,
    current_row,
    merge_params,
    param_name,
    resolve_contract,
)
from tests.registry.conftest import wipe

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def day(n: float) -> datetime:
    return T0 + timedelta(days=n)


def add_provenance(conn, code="pubmed", base="https://eutils.example/entrez") -> int:
    return conn.execute(
        insert(RegProvenance.__table__).values(
            provenance_code=code,
            provenance_name=code,
            base_url_default=base,
            timezone_default="UTC",
            lifecycle_status_code="ACTIVE",
            created_at=T0,
            updated_at=T0,
        )
    ).inserted_primary_key[0]


def add(conn, model, pid, scope="SOURCE", task=None, start=0, end=None, **cols) -> int:
    values = {
        "provenance_id": pid,
        "scope_code": scope,
        "task_type": task,
        "effective_from": day(start),
        "effective_to": day(end) if end is not None else None,
        "created_at": T0,
        "updated_at": T0,
        **cols,
    }
    if model is RegProvPaginationCfg:
        values.setdefault("pagination_mode_code", "PAGE_NUMBER")
    if model is RegProvEndpointDef:
        values.setdefault("endpoint_name", "esearch")
        values.setdefault("endpoint_usage_code", "SEARCH")
        values.setdefault("path_template", "/x")
    if model is RegProvCredential:
        values.setdefault("credential_name", f"key-{start}-{scope}-{task}")
        values.setdefault("auth_type_code", "API_KEY_QUERY")
    return conn.execute(insert(model.__table__).values(**values)).inserted_primary_key[0]


# -- rules, one by one ---------------------------------------------------------------------------
def test_task_row_wins_over_source_and_falls_back_when_absent(reg):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        src = add(conn, RegProvPaginationCfg, pid, page_size_value=100)
        upd = add(conn, RegProvPaginationCfg, pid, "TASK", "update", page_size_value=500)
        assert current_row(conn, RegProvPaginationCfg, pid, "update", day(1)).id == upd
        assert current_row(conn, RegProvPaginationCfg, pid, "harvest", day(1)).id == src
        assert current_row(conn, RegProvPaginationCfg, pid, None, day(1)).id == src


def test_half_open_intervals_and_time_travel(reg):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        old = add(conn, RegProvPaginationCfg, pid, start=0, end=10)
        new = add(conn, RegProvPaginationCfg, pid, start=10)
        assert current_row(conn, RegProvPaginationCfg, pid, None, day(9.99)).id == old
        assert current_row(conn, RegProvPaginationCfg, pid, None, day(10)).id == new  # [from, to)
        assert current_row(conn, RegProvPaginationCfg, pid, None, day(-1)) is None
        contract = resolve_contract(conn, "pubmed", None, day(5).isoformat())
        assert contract.pagination["id"] == old
        later = resolve_contract(conn, "pubmed", None, "2025-01-20T00:00:00Z")
        assert later.pagination["id"] == new


def test_ties_go_to_the_newest_start_then_the_highest_id(reg):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        add(conn, RegProvPaginationCfg, pid, start=0)
        later = add(conn, RegProvPaginationCfg, pid, start=3)  # both open: overlapping rows
        assert current_row(conn, RegProvPaginationCfg, pid, None, day(5)).id == later
        ep_a = add(conn, RegProvEndpointDef, pid, start=1, endpoint_name="a")
        ep_b = add(conn, RegProvEndpointDef, pid, start=1, endpoint_name="b")
        assert ep_b > ep_a
        assert current_row(conn, RegProvEndpointDef, pid, None, day(2)).id == ep_b


def test_endpoints_by_usage_and_name(reg):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        search = add(conn, RegProvEndpointDef, pid, endpoint_name="esearch")
        fetch = add(
            conn, RegProvEndpointDef, pid, endpoint_name="efetch", endpoint_usage_code="DETAIL"
        )
        other = add(conn, RegProvEndpointDef, pid, start=1, endpoint_name="esearch2")
        c = resolve_contract(conn, "pubmed", "update", day(2))
        assert c.endpoint["id"] == other  # newest SEARCH endpoint
        assert c.endpoints["DETAIL"]["id"] == fetch
        named = resolve_contract(conn, "pubmed", "update", day(2), endpoint_name="esearch")
        assert named.endpoint["id"] == search
        detail = resolve_contract(conn, "pubmed", None, day(2), usage="DETAIL")
        assert detail.endpoint["id"] == fetch


def test_credentials_endpoint_bound_then_task_then_default_then_newest(reg):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        ep = add(conn, RegProvEndpointDef, pid)
        g_src_old = add(conn, RegProvCredential, pid, start=0)
        g_src_new = add(conn, RegProvCredential, pid, start=1)
        g_src_default = add(conn, RegProvCredential, pid, start=0.5, is_default_preferred=True)
        g_task = add(conn, RegProvCredential, pid, "TASK", "update", start=0)
        bound = add(conn, RegProvCredential, pid, start=0, endpoint_id=ep, credential_name="b")
        add(conn, RegProvCredential, pid, "TASK", "harvest", start=0)  # other task type
        add(conn, RegProvCredential, pid, start=0, credential_name="gone", deleted=True)
        add(
            conn,
            RegProvCredential,
            pid,
            start=0,
            credential_name="off",
            lifecycle_status_code="DISABLED",
        )
        add(conn, RegProvCredential, pid, start=5, credential_name="future")
        order = [r.id for r in credentials_in_order(conn, pid, "update", day(2), ep)]
        assert order == [bound, g_task, g_src_default, g_src_new, g_src_old]
        c = resolve_contract(conn, "pubmed", "update", day(2))
        assert c.credential["id"] == bound
        assert [r["id"] for r in c.credentials] == order
        assert "secret_ciphertext" not in c.credential


def test_merge_rules_param_names_and_base_url(reg):
    assert merge_params(
        {"db": "pubmed", "retmode": "json", "tool": "x"},
        {"retmode": "xml", "tool": None, "term": "cancer"},
    ) == {"db": "pubmed", "retmode": "xml", "term": "cancer"}
    assert (
        param_name(
            "page",
            {"page_param_name": "p"},
            {"page_number_param_name": "page"},
            "page_number_param_name",
            "pg",
        )
        == "p"
    )
    assert (
        param_name(
            "page",
            {"page_param_name": None},
            {"page_number_param_name": "page"},
            "page_number_param_name",
            "pg",
        )
        == "page"
    )
    assert param_name("page", None, None, "page_number_param_name", "pg") == "pg"
    with reg.begin() as conn:
        pid = add_provenance(conn, base="https://default.example/")
        c = resolve_contract(conn, "pubmed", None, day(1))
        assert base_url(c) == "https://default.example"
        from artemis.registry.models import RegProvHttpCfg

        add(conn, RegProvHttpCfg, pid, base_url_override="https://override.example")
        assert (
            base_url(resolve_contract(conn, "pubmed", None, day(1))) == "https://override.example"
        )


# -- against a reference implementation -----------------------------------------------------------
def reference_current(rows, task_type, at):
    in_force = [r for r in rows if r["from"] <= at and (r["to"] is None or r["to"] > at)]
    if task_type is not None:
        task = [r for r in in_force if r["scope"] == "TASK" and r["task"] == task_type]
        if task:
            return max(task, key=lambda r: (r["from"], r["id"]))["id"]
    source = [r for r in in_force if r["scope"] == "SOURCE"]
    return max(source, key=lambda r: (r["from"], r["id"]))["id"] if source else None


def reference_credentials(rows, task_type, at, endpoint_id):
    def ok(r):
        return (
            r["status"] == "ACTIVE"
            and not r["deleted"]
            and r["from"] <= at
            and (r["to"] is None or r["to"] > at)
            and (r["scope"] == "SOURCE" or (r["scope"] == "TASK" and r["task"] == task_type))
            and (r["endpoint"] is None or r["endpoint"] == endpoint_id)
        )

    bound = [r for r in rows if ok(r) and endpoint_id is not None and r["endpoint"] == endpoint_id]
    free = [r for r in rows if ok(r) and r["endpoint"] is None]
    out = []
    for group in (bound, free):
        for scope in ("TASK", "SOURCE"):
            part = [r for r in group if r["scope"] == scope]
            part.sort(key=lambda r: (not r["default"], -r["from"].timestamp(), -r["id"]))
            out += part
    return [r["id"] for r in out]


row_spec = st.fixed_dictionaries(
    {
        "scope": st.sampled_from(["SOURCE", "TASK"]),
        "task": st.sampled_from(["harvest", "update", "backfill"]),
        "start": st.integers(0, 6),
        "length": st.one_of(st.none(), st.integers(1, 4)),
    }
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    specs=st.lists(row_spec, min_size=1, max_size=8),
    task_type=st.sampled_from([None, "harvest", "update", "backfill"]),
    at=st.floats(-1, 9),
)
def test_single_row_selection_matches_the_seed_sql(db_engine, specs, task_type, at):
    with db_engine.begin() as conn:
        wipe(conn)
        pid = add_provenance(conn)
        rows, seen = [], set()
        for s in specs:
            task = s["task"] if s["scope"] == "TASK" else None
            key = (s["scope"], task, s["start"])
            if key in seen:  # the unique interval index forbids exact duplicates
                continue
            seen.add(key)
            end = s["start"] + s["length"] if s["length"] else None
            rid = add(conn, RegProvPaginationCfg, pid, s["scope"], task, s["start"], end)
            rows.append(
                {
                    "id": rid,
                    "scope": s["scope"],
                    "task": task,
                    "from": day(s["start"]),
                    "to": day(end) if end is not None else None,
                }
            )
        got = current_row(conn, RegProvPaginationCfg, pid, task_type, day(at))
        assert (got.id if got else None) == reference_current(rows, task_type, day(at))


cred_spec = st.fixed_dictionaries(
    {
        "scope": st.sampled_from(["SOURCE", "TASK"]),
        "task": st.sampled_from(["harvest", "update"]),
        "start": st.integers(0, 3),
        "length": st.one_of(st.none(), st.none(), st.integers(1, 5)),
        "default": st.booleans(),
        "bound": st.sampled_from([False, False, True]),
        "other_endpoint": st.booleans(),
        "status": st.sampled_from(["ACTIVE"] * 5 + ["DISABLED"]),
        "deleted": st.sampled_from([False] * 5 + [True]),
    }
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    specs=st.lists(cred_spec, min_size=2, max_size=8),
    task_type=st.sampled_from([None, "harvest", "update"]),
    at=st.floats(1, 5),
    with_endpoint=st.booleans(),
)
def test_credential_order_matches_the_rules(db_engine, specs, task_type, at, with_endpoint):
    with db_engine.begin() as conn:
        wipe(conn)
        pid = add_provenance(conn)
        ep = add(conn, RegProvEndpointDef, pid, endpoint_name="main")
        other = add(conn, RegProvEndpointDef, pid, endpoint_name="other")
        rows = []
        for i, s in enumerate(specs):
            task = s["task"] if s["scope"] == "TASK" else None
            endpoint = (other if s["other_endpoint"] else ep) if s["bound"] else None
            end = s["start"] + s["length"] if s["length"] else None
            rid = add(
                conn,
                RegProvCredential,
                pid,
                s["scope"],
                task,
                s["start"],
                end,
                credential_name=f"k{i}",
                is_default_preferred=s["default"],
                endpoint_id=endpoint,
                lifecycle_status_code=s["status"],
                deleted=s["deleted"],
            )
            rows.append(
                {
                    "id": rid,
                    "scope": s["scope"],
                    "task": task,
                    "from": day(s["start"]),
                    "to": day(end) if end is not None else None,
                    "default": s["default"],
                    "endpoint": endpoint,
                    "status": s["status"],
                    "deleted": s["deleted"],
                }
            )
        endpoint_id = ep if with_endpoint else None
        got = [r.id for r in credentials_in_order(conn, pid, task_type, day(at), endpoint_id)]
        assert got == reference_credentials(rows, task_type, day(at), endpoint_id)
