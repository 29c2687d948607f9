"""The combinations of request-mode settings that cannot work, named: checked on each row
and on the rows of a file that meet (the import refuses them) and on a run's contract
(a row written around the import: the run stops with CONFIG_ERROR before a request).

Request modes: a search by GET or POST (``default_body_payload``,
``request_content_type``, ``paging_params_in_code``), JSON or XML answers
(``response_format_code``: the answer's paths are JSONPaths or XML paths), SCROLL
paging (``scroll_*``), NEXT_URL paging (``next_url_jsonpath``) and SINGLE (no paging),
and the SEARCH → DETAIL flow (``batching_cfg``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jsonpath

from artemis.registry.resolve import Contract, as_utc
from artemis.sources.responses import FIELD as RESPONSE_ACTIONS
from artemis.sources.responses import rule_problems
from artemis.sources.xmldoc import check_xml_path, is_xml_path

FORM = "application/x-www-form-urlencoded"
# Paths into a page of the SEARCH answer (JSONPaths, or XML paths for an XML endpoint).
ANSWER_PATHS = (
    "records_jsonpath",
    "total_count_jsonpath",
    "next_cursor_jsonpath",
    "next_token_jsonpath",
    "next_page_jsonpath",
    "has_more_jsonpath",
    "scroll_id_jsonpath",
    "next_url_jsonpath",
)
# Paths into one record (always JSONPaths: an XML record is a mapping by then).
RECORD_PATHS = ("record_key_jsonpath", "detail_id_jsonpath")
# What an XML search must name: the defaults of these paths are JSONPaths.
_XML_NEEDS = {
    "CURSOR": "next_cursor_jsonpath",
    "TOKEN": "next_token_jsonpath",
    "SCROLL": "scroll_id_jsonpath",
    "NEXT_URL": "next_url_jsonpath",
}
# What each mode reads its next page from, for a next_url_jsonpath set on another mode.
_OWN_NEXT = {
    "PAGE_NUMBER": "which has next_page_jsonpath",
    "OFFSET": "which has next_page_jsonpath",
    "CURSOR": "which has next_cursor_jsonpath",
    "TOKEN": "which has next_token_jsonpath",
    "SCROLL": "which has scroll_id_jsonpath",
    "LINK_HEADER": "which reads the next URL from the Link header",
    "SINGLE": "one request, no next page",
}
# Paging columns of a pagination row that a SINGLE request would not read (the scroll
# columns and next_url_jsonpath are refused for every other mode already).
PAGING_ONLY = (
    "page_size_value",
    "max_page_size_value",
    "page_number_param_name",
    "page_size_param_name",
    "start_page_number",
    "offset_param_name",
    "limit_param_name",
    "cursor_param_name",
    "next_cursor_jsonpath",
    "initial_cursor_value",
    "token_param_name",
    "next_token_jsonpath",
    "max_result_window",
    "short_page_is_last",
    "absent_token_is_last",
    "stateful_cursor",
    "next_page_jsonpath",
    "has_more_jsonpath",
    "paging_params_in_code",
)
# A SEARCH endpoint's own paging parameter names (they win over the pagination row's).
ENDPOINT_PAGING = (
    "page_param_name",
    "page_size_param_name",
    "offset_param_name",
    "limit_param_name",
    "cursor_param_name",
    "token_param_name",
)
SCROLL_COLUMNS = (
    "scroll_path_template",
    "scroll_keep_alive_value",
    "scroll_keep_alive_param_name",
    "scroll_id_jsonpath",
    "scroll_id_param_name",
    "scroll_release_path_template",
)
TEMPLATE_KEYS = ("params", "body")
# Columns of these request modes that the E-utilities source (PUBMED) does not read.
NOT_FOR_PUBMED = {
    "endpoint_def": ("default_body_payload", "request_content_type"),
    "pagination_cfg": ("paging_params_in_code", *SCROLL_COLUMNS),
    "batching_cfg": ("request_template_json", "detail_id_jsonpath", "detail_records_jsonpath"),
}


def check_path(value: str | None) -> str | None:
    """A path column's value: a JSONPath (``$...``) or an XML path (``./...``)."""
    if value is None:
        return value
    if is_xml_path(value):
        return check_xml_path(value)
    try:
        jsonpath.compile(value)
    except jsonpath.JSONPathError as e:
        raise ValueError(f"not a JSONPath: {str(e).splitlines()[0]}") from None
    return value


def _flat(payload: dict[str, Any]) -> str | None:
    for key, value in payload.items():
        for one in value if isinstance(value, list) else [value]:
            if isinstance(one, dict | list):
                return key
    return None


def endpoint_problems(row: dict[str, Any]) -> list[str]:
    out = []
    usage, method = row.get("endpoint_usage_code"), (row.get("http_method_code") or "GET")
    body, kind = row.get("default_body_payload"), row.get("request_content_type")
    if usage == "SEARCH" and method != "POST":
        for name in ("default_body_payload", "request_content_type"):
            if row.get(name) is not None:
                out.append(f"{name} is for a POST search (http_method_code is {method})")
    if body is not None and kind == FORM:
        nested = _flat(body)
        if nested is not None:
            out.append(
                f"default_body_payload.{nested}: a form body ({FORM}) holds text, numbers "
                "and lists of them; send nested values as application/json"
            )
    out += response_actions_problems(row)
    return out


def response_actions_problems(row: dict[str, Any]) -> list[str]:
    """An endpoint's response rules: each one's problems by index and field; a rule's
    jsonpath in the language of the endpoint's answers; rules only where answers are read
    as pages (SEARCH, DETAIL)."""
    rules = row.get(RESPONSE_ACTIONS)
    if rules is None:
        return []
    usage = row.get("endpoint_usage_code")
    if usage not in ("SEARCH", "DETAIL"):
        return [f"{RESPONSE_ACTIONS} is read for SEARCH and DETAIL endpoints, not {usage}"]
    out = rule_problems(rules)
    if out:
        return out
    xml = (row.get("response_format_code") or "JSON") == "XML"
    for i, rule in enumerate(rules):
        path = rule.get("jsonpath")
        if path is not None and is_xml_path(path) != xml:
            want = "an XML path (./...)" if xml else "a JSONPath ($...)"
            out.append(
                f"{RESPONSE_ACTIONS}[{i}].jsonpath {path!r}: the endpoint answers "
                f"{'XML' if xml else 'JSON'}, so it is {want}"
            )
    return out


def pagination_problems(row: dict[str, Any]) -> list[str]:
    out = []
    mode = row.get("pagination_mode_code")
    given = [c for c in SCROLL_COLUMNS if row.get(c) is not None]
    if mode == "SCROLL":
        if not row.get("scroll_path_template"):
            out.append(
                "SCROLL paging needs scroll_path_template (where a scroll continues, "
                "e.g. /_search/scroll)"
            )
    elif given:
        out.append(f"{given[0]} is for SCROLL paging, not {mode}")
    for name in ("scroll_path_template", "scroll_release_path_template"):
        value = row.get(name)
        if value is not None and not value.startswith("/"):
            out.append(f"{name} is a path after the base URL, starting with '/' (got {value!r})")
    if row.get("paging_params_in_code") == "BODY" and mode in ("LINK_HEADER", "NEXT_URL"):
        out.append(f"{mode} paging follows the next URL: its parameters are in the query")
    out += _next_url_and_single(row, mode or "PAGE_NUMBER")
    kinds = {is_xml_path(row[c]) for c in ANSWER_PATHS if row.get(c)}
    if len(kinds) > 1:
        out.append("the answer's paths are all JSONPaths ($...) or all XML paths (./...)")
    for name in RECORD_PATHS:
        if row.get(name) and is_xml_path(row[name]):
            out.append(f"{name} is a JSONPath into a record (an XML record is a mapping)")
    return out


def _next_url_and_single(row: dict[str, Any], mode: str) -> list[str]:
    """``next_url_jsonpath`` is NEXT_URL's alone; a SINGLE request reads no paging column."""
    out = []
    if row.get("next_url_jsonpath") is not None and mode != "NEXT_URL":
        own = _OWN_NEXT.get(mode)
        out.append(
            f"next_url_jsonpath is for NEXT_URL paging, not {mode}" + (f" ({own})" if own else "")
        )
    if mode == "SINGLE":
        idle = [c for c in PAGING_ONLY if row.get(c) is not None and row.get(c) is not False]
        if idle:
            them = "it" if len(idle) == 1 else "them"
            out.append(
                f"SINGLE is one request without paging: {', '.join(idle)} would do nothing "
                f"(leave {them} out, or choose the mode that pages this way)"
            )
    return out


def template_problems(template: Any, batch_size: int | None) -> list[str]:
    if not isinstance(template, dict):
        return ["request_template_json is a mapping of params and body"]
    out = []
    for key, value in template.items():
        if key not in TEMPLATE_KEYS:
            out.append(
                f"request_template_json.{key}: unknown key (it holds {' and '.join(TEMPLATE_KEYS)})"
            )
        elif not isinstance(value, dict):
            out.append(f"request_template_json.{key} is a mapping")
    text = json.dumps(template)
    if not any(p in text for p in ("{ids}", "{id}", "{ids_json}")):
        out.append("request_template_json names no ids: put {ids}, {id} or {ids_json} in it")
    if "{id}" in text and batch_size != 1:
        out.append("{id} is one id: set detail_batch_size to 1 (or use {ids})")
    return out


def batching_problems(row: dict[str, Any]) -> list[str]:
    out = []
    template = row.get("request_template_json")
    if template is not None:
        out += template_problems(template, row.get("detail_batch_size"))
    value = row.get("detail_id_jsonpath")
    if value and is_xml_path(value):
        out.append("detail_id_jsonpath is a JSONPath into a search record")
    return out


def search_pairing(ep: dict[str, Any], pg: dict[str, Any]) -> list[str]:
    """A SEARCH endpoint with the pagination cfg it is paged by."""
    out = []
    method = ep.get("http_method_code") or "GET"
    if pg.get("paging_params_in_code") == "BODY" and method != "POST":
        out.append(f"paging_params_in_code BODY needs a POST search (http_method_code {method})")
    if pg.get("pagination_mode_code") == "SINGLE":
        idle = [c for c in ENDPOINT_PAGING if ep.get(c) is not None]
        if idle:
            out.append(
                f"the SEARCH endpoint's {', '.join(idle)}: SINGLE paging sends no paging "
                f"parameter (leave {'it' if len(idle) == 1 else 'them'} out)"
            )
    xml = (ep.get("response_format_code") or "JSON") == "XML"
    for name in ANSWER_PATHS:
        value = pg.get(name)
        if value and is_xml_path(value) != xml:
            want = "an XML path (./...)" if xml else "a JSONPath ($...)"
            fmt = "XML" if xml else "JSON"
            out.append(f"{name} {value!r}: the SEARCH endpoint answers {fmt}, so it is {want}")
    if xml:
        mode = pg.get("pagination_mode_code")
        for needed in ("records_jsonpath", _XML_NEEDS.get(str(mode))):
            if needed and not pg.get(needed):
                out.append(f"an XML search names {needed} (an XML path: its default is a JSONPath)")
    return out


def detail_pairing(
    ep: dict[str, Any], bt: dict[str, Any] | None, pg: dict[str, Any] | None
) -> list[str]:
    """A DETAIL endpoint with the batching cfg its requests are built by and the
    pagination cfg of the search that gives the ids."""
    out = []
    bt, pg = bt or {}, pg or {}
    if not (bt.get("detail_id_jsonpath") or pg.get("record_key_jsonpath")):
        out.append(
            "a DETAIL endpoint fetches the search's records by id: name where the id is "
            "(batching_cfg.detail_id_jsonpath or pagination_cfg.record_key_jsonpath)"
        )
    xml = (ep.get("response_format_code") or "JSON") == "XML"
    records = bt.get("detail_records_jsonpath")
    if xml and not records:
        out.append("an XML DETAIL endpoint needs detail_records_jsonpath (an XML path)")
    elif records and is_xml_path(records) != xml:
        want = "an XML path (./...)" if xml else "a JSONPath ($...)"
        out.append(
            f"detail_records_jsonpath {records!r}: the DETAIL endpoint's answer needs {want}"
        )
    method = ep.get("http_method_code") or "GET"
    if method != "POST" and bt.get("post_threshold_ids") is None:
        for name in ("default_body_payload", "request_content_type"):
            if ep.get(name) is not None:
                out.append(
                    f"the DETAIL endpoint's {name} is sent only by POST (http_method_code "
                    "POST, or post_threshold_ids)"
                )
        if (bt.get("request_template_json") or {}).get("body") is not None:
            out.append(
                "request_template_json.body is sent only by POST (http_method_code POST, or "
                "post_threshold_ids)"
            )
    return out


def contract_problems(contract: Contract) -> list[str]:
    """Every problem of a run's contract (the REST source's settings)."""
    ep, pg, bt = contract.endpoint or {}, contract.pagination or {}, contract.batching or {}
    detail = contract.endpoints.get("DETAIL")
    out = endpoint_problems(ep) + pagination_problems(pg) + batching_problems(bt)
    out += search_pairing(ep, pg)
    if detail is not None:
        out += endpoint_problems(detail) + detail_pairing(detail, bt, pg)
    return out


# -- the rows of one file ---------------------------------------------------------------------
def _instant(value: Any) -> datetime | None:
    return as_utc(value) if value is not None else None


def meet(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two rows can be in force together for one run: their scopes can meet (SOURCE with
    anything, TASK with the same task type) and their intervals overlap."""
    if a.get("scope_code") == b.get("scope_code") == "TASK" and a.get("task_type") != b.get(
        "task_type"
    ):
        return False
    a0, a1 = _instant(a.get("effective_from")), _instant(a.get("effective_to"))
    b0, b1 = _instant(b.get("effective_from")), _instant(b.get("effective_to"))
    if a0 is None or b0 is None:
        return True
    return (b1 is None or a0 < b1) and (a1 is None or b0 < a1)


def file_problems(doc: dict[str, Any]) -> list[str]:
    """What a file's rows cannot do together, each named by its rows' places."""
    eps = list(enumerate(doc.get("endpoint_def") or []))
    pgs = list(enumerate(doc.get("pagination_cfg") or []))
    bts = list(enumerate(doc.get("batching_cfg") or []))
    family = {r.get("record_family_code") for r in doc.get("record_model") or []} - {None}
    if "PUBMED" in family:
        # Read by the E-utilities source: esearch and efetch as it knows them.
        return _pubmed_problems(doc)
    out: list[str] = []
    searches = [(i, e) for i, e in eps if e.get("endpoint_usage_code") == "SEARCH"]
    details = [(i, e) for i, e in eps if e.get("endpoint_usage_code") == "DETAIL"]
    for i, ep in searches:
        for j, pg in pgs:
            if meet(ep, pg):
                out += [
                    f"endpoint_def[{i}] with pagination_cfg[{j}]: {p}"
                    for p in search_pairing(ep, pg)
                ]
    for i, ep in details:
        pairs: list[tuple[int | None, dict[str, Any] | None]] = [
            (k, bt) for k, bt in bts if meet(ep, bt)
        ]
        for k, bt in pairs or [(None, None)]:
            # The id may be named by any pagination row in force with it.
            pg_keys = [pg for _, pg in pgs if meet(ep, pg) and pg.get("record_key_jsonpath")]
            problems = detail_pairing(ep, bt, pg_keys[0] if pg_keys else None)
            where = f"endpoint_def[{i}]" + (f" with batching_cfg[{k}]" if k is not None else "")
            out += [f"{where}: {p}" for p in problems]
    if bts and eps and not details:
        out.append(
            "batching_cfg: its settings are read by DETAIL requests, and the file has no "
            "DETAIL endpoint"
        )
    return out


def _pubmed_problems(doc: dict[str, Any]) -> list[str]:
    """The E-utilities source reads esearch as JSON and efetch as PubMed XML, and none of
    the columns of the other request modes."""
    out = []
    for section, names in NOT_FOR_PUBMED.items():
        for i, row in enumerate(doc.get(section) or []):
            for name in names:
                if row.get(name) is not None:
                    out.append(
                        f"{section}[{i}].{name}: not read by the PUBMED family's E-utilities source"
                    )
    want = {"SEARCH": "JSON", "DETAIL": "XML"}
    for i, ep in enumerate(doc.get("endpoint_def") or []):
        fmt, usage = ep.get("response_format_code"), ep.get("endpoint_usage_code")
        if fmt is not None and usage in want and fmt != want[usage]:
            out.append(
                f"endpoint_def[{i}].response_format_code: the PUBMED family reads its "
                f"{usage} endpoint as {want[usage]}"
            )
    return out
