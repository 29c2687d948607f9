"""A source's JSON answer read by JSONPath, against its contract: "absent" and "null" kept
apart (``MISSING``), counts and flags read strictly, and the SOURCE_CONTRACT error naming
the path that was expected and what was found.

Below both the paginators (``artemis/sources/``) and the completeness checks
(``artemis/completeness.py``, which reads record keys by path): neither imports the other
through it.
"""

from __future__ import annotations

import reprlib
from abc import ABC, abstractmethod
from functools import cache
from typing import Any

import jsonpath

from artemis.errors import ArtemisError, ErrorCode
from artemis.redact import redact_text


class _Missing:
    """The marker of a key that is absent (as opposed to present and null)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


class Document(ABC):
    """An answer read by paths of its own language (an XML answer): the lookups below
    hand it its path instead of reading it as JSON."""

    @abstractmethod
    def lookup(self, path: str) -> Any:
        """The value at ``path``, in the document's own path language."""

    def as_flag(self, value: Any) -> Any:
        """A value found in it read as true/false (unchanged when it is neither)."""
        return value


@cache
def _compiled(path: str) -> Any:
    return jsonpath.compile(path.strip())


def json_path_lookup(data: Any, path: str) -> Any:
    """The value at a JSONPath (``$.message.next-cursor``, ``$.items[0].id``, RFC 9535 via
    python-jsonpath); ``MISSING`` when nothing is there, so that "absent" and "null" stay
    different answers. A path that selects several values (``$.data[*].attributes``)
    gives the list of them."""
    if isinstance(data, Document):
        return data.lookup(path)
    query = _compiled(path)
    if query.singular_query():
        match = query.match(data)
        return MISSING if match is None else match.obj
    found = query.findall(data)
    return found if found else MISSING


def json_path_get(data: Any, path: str) -> Any:
    """Like ``json_path_lookup``, with None for an absent value."""
    value = json_path_lookup(data, path)
    return None if value is MISSING else value


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 400, 400, 400


def describe(value: Any) -> str:
    """What was found, for an error message: the type and a short repr."""
    if value is MISSING:
        return "no such key"
    # A bounded repr (a value found may be most of a large answer), redacted before the
    # cut below so that a secret across it is still found whole.
    text = redact_text(_SHORT.repr(value))
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


def contract_error(who: str, path: str, expected: str, found: Any) -> ArtemisError:
    """The source broke its contract: ``expected`` at ``path``, ``found`` instead. The
    source adds the request it made (``RestSource`` appends it)."""
    return ArtemisError(
        ErrorCode.SOURCE_CONTRACT,
        f"{who}: expected {expected} at {path!r}, found {describe(found)}",
        details={"path": path},
    )


def as_count(value: Any) -> int | None:
    """A non-negative integer, also from a digit string (E-utilities sends ``"404"``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def required_count(data: Any, path: str, who: str) -> int:
    value = json_path_lookup(data, path)
    count = as_count(value)
    if count is None:
        raise contract_error(who, path, "the total count (a non-negative integer)", value)
    return count


def required_flag(data: Any, path: str, who: str) -> bool:
    """A "has more" flag: present on every page, true or false (nothing else ends)."""
    value = json_path_lookup(data, path)
    if isinstance(data, Document):
        value = data.as_flag(value)
    if not isinstance(value, bool):
        raise contract_error(who, path, "true or false (are there more pages)", value)
    return value
