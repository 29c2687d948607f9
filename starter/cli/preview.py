"""`artemis registry preview`: a source's first pages and a drafted record model
(artemis/registry/preview.py), printed as a table, as JSON, or the drafted model alone."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

from artemis.config import Settings

# The widest a column of the records' table gets, and how many columns it shows at most.
COLUMN_WIDTH = 24
MAX_COLUMNS = 8


def run_preview(
    settings: Settings, target: str, resource: str | None, pages: int
) -> dict[str, Any]:
    """The preview of ``target``: a registry file when it names one, else a provenance's
    code in the registry."""
    # lazy: importing them costs every `artemis` start-up ~0.6 s
    from artemis.db import get_engine
    from artemis.errors import ArtemisError, ErrorCode
    from artemis.http import make_client
    from artemis.registry.preview import file_contract, preview, registry_contract
    from artemis.registry.yaml_io import check_size

    path = Path(target)
    from_file = path.is_file()
    if from_file:
        check_size(path.stat().st_size, target)
        contract = file_contract(path.read_text(), target)
    elif path.suffix in (".yaml", ".yml") or "/" in target:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"no such file: {target}")
    else:
        contract = registry_contract(get_engine(settings.database.url), target)

    async def fetch() -> dict[str, Any]:
        client = make_client(settings.http_client, settings.security)
        try:
            return await preview(
                contract,
                settings,
                client,
                resource=resource,
                pages=pages,
                secrets_from_env=from_file,
            )
        finally:
            await client.aclose()

    return asyncio.run(fetch())


def as_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str) + "\n"


def as_table(report: dict[str, Any], width: int | None = None) -> str:
    """The preview as text: the requests, the pages and paging, the records as a table
    (a few columns, cut to the terminal's width), what the model would set aside and
    leave out, then the drafted model."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    out = [_heading(report), "", "requests:"]
    for call in report["requests"]:
        where = f"[{call['resource']}] " if call.get("resource") else ""
        status = call.get("status") or call.get("error") or "-"
        out.append(f"  {where}{call['request']}  → {status}  {call.get('millis', '-')} ms")
    records = report["records"]
    stated = report.get("stated_total")
    out += [
        "",
        f"pages: {len(report['pages'])}, records: {len(records)}, stated total: "
        + (str(stated) if stated is not None else "none"),
        ("paging goes on: " if report["paging"]["goes_on"] else "paging ends: ")
        + report["paging"]["why"],
        "",
        "records:",
        *("  " + line for line in record_table(records, width - 2)),
        "",
        *_verdict_lines(report),
        "",
    ]
    if report.get("drafted_yaml"):
        out += ["drafted record model (paste it into the file):", report["drafted_yaml"]]
    else:
        out.append(f"no model drafted: {report.get('draft_problem')}")
    return "\n".join(out).rstrip("\n") + "\n"


def _heading(report: dict[str, Any]) -> str:
    parent = report.get("parent")
    text = f"provenance {report['provenance']} ({report['source']})"
    if report.get("resource"):
        text += f"  resource {report['resource']}"
    if parent:
        text += f"  asked for the first record of {parent['resource']}"
    return text


def _verdict_lines(report: dict[str, Any]) -> list[str]:
    """What the record model in force would make of the records."""
    if report.get("model") is None:
        return ["record model: none in force (records would land as the source gives them)"]
    aside = report["set_aside"]
    out = [f"set aside by the record model: {len(aside) or 'none'}"]
    for bad in aside:
        where = f"page {bad['page'] + 1}"
        if bad.get("position") is not None:
            where += f" record {bad['position'] + 1}"
        key = f" {json.dumps(bad['key'], default=str)}" if bad.get("key") else ""
        out.append(f"  {where}{key}: {bad['reason']}")
    names = report["not_named"]
    out.append(f"fields the model does not name: {len(names) or 'none'}")
    out += [f"  {d['field']} ({d['type']}, e.g. {d['example']})" for d in names]
    if report["missing"]:
        out.append(f"fields the model names that no record carries: {', '.join(report['missing'])}")
    out += [f"the run would stop: {why}" for why in report["stops"]]
    return out


def record_table(records: list[Any], width: int) -> list[str]:
    """Records as rows of their first fields, each cell cut to ``COLUMN_WIDTH``, as many
    columns as ``width`` holds."""
    rows = [r for r in records if isinstance(r, dict)]
    if not rows:
        return ["(no record)"]
    names: list[str] = []
    for r in rows:
        names += [n for n in r if n not in names]
    cells = [[_cell(r[n]) if n in r else "" for n in names] for r in rows]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    shown, used = 0, 0
    while shown < min(len(names), MAX_COLUMNS) and used + widths[shown] <= width:
        used += widths[shown] + 2
        shown += 1
    shown = max(shown, 1)
    lines = ["  ".join(n.ljust(w) for n, w in zip(names[:shown], widths, strict=False))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row[:shown], widths, strict=False)) for row in cells
    ]
    if shown < len(names):
        lines.append(f"(and {len(names) - shown} more fields: -o json shows them all)")
    return [line.rstrip()[:width] for line in lines]


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(str(text).split())
    return text if len(text) <= COLUMN_WIDTH else text[: COLUMN_WIDTH - 1] + "…"
