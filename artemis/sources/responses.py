"""Answers that are not errors, and errors inside a 200: an endpoint's
``response_actions_json`` (docs/registry.md "Answers that are not errors").

A rule matches an answer when every condition it has holds: ``status`` (one status or a
list of them), ``jsonpath`` (a value there; with ``equals``, that value) and ``contains``
(a substring of the body). The first rule that matches acts, before the status is looked
at:

- ``ignore``: the answer holds nothing, and the resource's paging ends with it (a
  sub-resource whose parent was deleted answers 404; an empty search answers 204);
- ``retry``: a transient failure, waited out as a 503 is (``{"error": "rate limited"}``
  inside a 200);
- ``fail``: a failure no retry fixes, with ``code`` (default SOURCE_ERROR).

An answer no rule matches is read as it would be without rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonpath
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Answer, body_excerpt
from artemis.logsetup import get_logger
from artemis.outage import status_reason
from artemis.paging import MISSING, json_path_lookup
from artemis.sources.xmldoc import check_xml_path, is_xml_path

log = get_logger(__name__)

ACTIONS = ("ignore", "retry", "fail")
KEYS = ("status", "jsonpath", "equals", "contains", "action", "code")
# What a rule matches on: it names one of them at least.
CONDITIONS = ("status", "jsonpath", "contains")
FIELD = "response_actions_json"
_UNREAD: Any = object()


class ResponseRule(BaseModel):
    """One rule (see the module)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: tuple[int, ...] | None = None
    jsonpath: str | None = None
    equals: Any = None
    contains: str | None = None
    action: str
    code: ErrorCode | None = None

    @field_validator("status", mode="before")
    @classmethod
    def _status(cls, value: Any) -> Any:
        if value is None:
            return None
        values = value if isinstance(value, list) else [value]
        if not values or not all(_is_status(v) for v in values):
            raise ValueError(f"an HTTP status (100-599) or a list of them (got {value!r})")
        return tuple(values)

    @field_validator("jsonpath", mode="before")
    @classmethod
    def _path(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"a JSONPath ($...) or an XML path (./...) (got {value!r})")
        if is_xml_path(value):
            return check_xml_path(value)
        try:
            jsonpath.compile(value)
        except jsonpath.JSONPathError as e:
            raise ValueError(f"not a JSONPath: {str(e).splitlines()[0]}") from None
        return value

    @field_validator("contains", mode="before")
    @classmethod
    def _contains(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"a non-empty text to find in the body (got {value!r})")
        return value

    @field_validator("action", mode="before")
    @classmethod
    def _action(cls, value: Any) -> Any:
        if value not in ACTIONS:
            raise ValueError(f"must be one of {', '.join(ACTIONS)} (got {value!r})")
        return value

    @field_validator("code", mode="before")
    @classmethod
    def _code(cls, value: Any) -> Any:
        if value is not None and value not in {c.value for c in ErrorCode}:
            raise ValueError(
                f"must be an error code, one of {', '.join(c.value for c in ErrorCode)} "
                f"(got {value!r})"
            )
        return value

    @model_validator(mode="after")
    def _whole(self) -> ResponseRule:
        if all(getattr(self, name) is None for name in CONDITIONS):
            raise ValueError("a rule matches on status, jsonpath or contains: name one at least")
        if self.code is not None and self.action != "fail":
            raise ValueError(f"code is for action fail (this rule's action is {self.action})")
        if "equals" in self.model_fields_set and self.jsonpath is None:
            raise ValueError("equals compares the value at jsonpath: name the jsonpath")
        return self

    @property
    def error_code(self) -> ErrorCode:
        return self.code or ErrorCode.SOURCE_ERROR

    def describe(self) -> str:
        """What the rule matches, for an error message (``status 200, $.error == 'x'``)."""
        parts = []
        if self.status is not None:
            one = self.status[0] if len(self.status) == 1 else list(self.status)
            parts.append(f"status {one}")
        if self.jsonpath is not None:
            if "equals" in self.model_fields_set:
                parts.append(f"{self.jsonpath} == {self.equals!r}")
            else:
                parts.append(f"{self.jsonpath} present")
        if self.contains is not None:
            parts.append(f"body contains {self.contains!r}")
        return ", ".join(parts)

    def found_in(self, doc: Any) -> bool:
        """The rule's jsonpath condition holds in the parsed body ``doc``."""
        if self.jsonpath is None:
            return True
        if doc is MISSING:
            return False
        try:
            value = json_path_lookup(doc, self.jsonpath)
        except (ArtemisError, ValueError, TypeError):
            # A path of the other language (an XML path into JSON, say) finds nothing.
            return False
        if value is MISSING:
            return False
        return "equals" not in self.model_fields_set or _same(value, self.equals)


def _is_status(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values are: true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _checked(raw: Any) -> tuple[list[ResponseRule], list[str]]:
    """The rules of ``raw`` and the problems of those that are not rules, each named by
    its place (``[1].action: ...``)."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        return [], [f": a list of rules (got {type(raw).__name__})"]
    rules, problems = [], []
    for i, one in enumerate(raw):
        if not isinstance(one, dict):
            problems.append(f"[{i}]: a rule is a mapping (got {type(one).__name__})")
            continue
        try:
            rules.append(ResponseRule.model_validate(one))
        except ValidationError as e:
            problems += [f"[{i}]{_problem(err)}" for err in e.errors()]
    return rules, problems


def _problem(err: Any) -> str:
    """One pydantic error as ``.field: why``."""
    where = "".join(f".{p}" for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{where}: unknown key (a rule holds {', '.join(KEYS)})"
    if kind == "missing":
        return f"{where}: required ({', '.join(ACTIONS)})"
    return f"{where}: {str(err['msg']).removeprefix('Value error, ')}"


def rule_problems(raw: Any) -> list[str]:
    """What is wrong with a ``response_actions_json`` value, each problem named by the
    rule's index and field (``response_actions_json[1].action: ...``)."""
    return [FIELD + p for p in _checked(raw)[1]]


def parse_rules(raw: Any) -> list[ResponseRule]:
    """The rules of a ``response_actions_json`` value; CONFIG_ERROR naming each problem."""
    rules, problems = _checked(raw)
    if problems:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR, "; ".join(FIELD + p for p in problems), retryable=False
        )
    return rules


def match_rule(
    rules: Sequence[ResponseRule], status: int, body: bytes, parsed: Callable[[], Any]
) -> tuple[int, ResponseRule] | None:
    """The first rule an answer matches, with its index; None: none does. ``parsed``
    gives the parsed body (JSON, or an XML document), called once, and only for a rule
    with a jsonpath; a body it cannot parse matches no jsonpath."""
    doc = _UNREAD
    for i, rule in enumerate(rules):
        if rule.status is not None and status not in rule.status:
            continue
        if rule.contains is not None and rule.contains.encode() not in body:
            continue
        if rule.jsonpath is not None:
            if doc is _UNREAD:
                doc = _parse(parsed)
            if not rule.found_in(doc):
                continue
        return i, rule
    return None


def once(read: Callable[[], Any]) -> Callable[[], Any]:
    """``read``, called at most once when it succeeds: its value is kept (a body parsed
    for a rule's jsonpath is not parsed again for its records)."""
    kept: list[Any] = []

    def value() -> Any:
        if not kept:
            kept.append(read())
        return kept[0]

    return value


def _parse(parsed: Callable[[], Any]) -> Any:
    try:
        return parsed()
    except (ArtemisError, ValueError):
        return MISSING


@dataclass(frozen=True)
class Asked:
    """The request an answer is to: the source's name, what it asked (named in errors)
    and the request as it was sent (``describe()``: no secret)."""

    source: str
    what: str
    request: str


def act_on(
    rules: Sequence[ResponseRule],
    resp: Answer,
    parsed: Callable[[], Any],
    asked: Asked,
    status_error: Callable[[str, Answer], ArtemisError],
) -> bool:
    """Apply the first rule ``resp`` matches. True: an ``ignore`` rule matched (logged,
    never with the body); False: no rule did. A ``retry`` rule raises a retryable
    SOURCE_ERROR, a ``fail`` rule a final error of its code, each naming the request
    and the rule. ``status_error``: the contract's classifier, whose ``Retry-After``
    reading a retry honours as it would a 503's."""
    hit = match_rule(rules, resp.status_code, resp.content, parsed)
    if hit is None:
        return False
    source, what, request = asked.source, asked.what, asked.request
    index, rule = hit
    status = resp.status_code
    if rule.action == "ignore":
        log.info("response_ignored", source=source, status=status, rule=index, request=what)
        return True
    retry = rule.action == "retry"
    e = ArtemisError(
        ErrorCode.SOURCE_ERROR if retry else rule.error_code,
        f"{what} answered {status}, which {FIELD}[{index}] ({rule.describe()}) says to "
        f"{rule.action}: {body_excerpt(resp)}",
        retryable=retry,
        # Not ``status``: an answer a rule acted on is never taken for an expired session.
        details={
            "http_status": status,
            "reason": f"{status_reason(status)}, {FIELD}[{index}]",
            "rule": index,
        },
        retry_after_s=status_error(what, resp).retry_after_s if retry else None,
    )
    raise e.with_request(request)
