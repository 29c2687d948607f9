"""XML answers of registry sources: parsed safely, read by path, their elements made
records.

**Paths.** An XML path is ElementTree's XPath subset evaluated from the answer's root
element, and always starts with ``.``: ``./channel/item`` (every ``item`` under
``channel``), ``.//entry``, ``./result[@type='hits']/doc``, ``.`` (the root itself).
Namespaced elements match as ``{uri}tag`` or ``{*}tag``. A trailing ``/@name`` reads
an attribute instead of an element: ``./@total``, ``./meta/page/@next``. A single value
(a total, a cursor, a flag) is the element's text, stripped; an empty element reads as
null; a missing one is absent (the contract decides what absent means). Paths into a
record (a record key, a DETAIL id) are JSONPaths over the record as made below.

**Records.** An element becomes a mapping: each attribute under ``@name``, each child
element under its tag (its local name: the namespace is dropped), in document order. A
child that has neither attributes nor children is its text (stripped; null when
empty); any other child is a mapping by the same rule, with its own text under
``#text``. A tag that occurs more than once in one element is a list of its values.
XML has no types: a field the record model types ``int``, ``float`` or ``bool``
(``true``/``false``/``1``/``0``) is converted from its text, and a field it types as a
list is a list even when the element occurs once. A text that does not convert stays as
it is, for the record model's check to refuse by name.

**Safety.** No entity declaration (internal or external) and no external reference is
accepted, the answers' size is bounded where they are read (``max_body_bytes``), their
depth here (``MAX_XML_DEPTH``, 256 nested elements), and the document is built by a
plain expat parser (no DTD is fetched).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from functools import cache
from typing import Any
from xml.parsers import expat

from artemis.errors import ArtemisError, ErrorCode
from artemis.paging import MISSING, Document, contract_error


class XmlText(str):
    """Text read from an XML answer: typed by its reader (a count, a flag), where a JSON
    value would carry its own type."""


class XmlDocument(Document):
    """A parsed XML answer; ``lookup`` reads one value, ``records`` the records."""

    def __init__(self, root: ET.Element) -> None:
        self.root = root

    def select(self, path: str) -> list[Any]:
        """The elements (or attribute values, for a trailing ``/@name``) at ``path``."""
        element_path, attribute = split_path(path)
        found = [self.root] if element_path == "." else self.root.findall(element_path)
        if attribute is None:
            return found
        return [el.attrib[attribute] for el in found if attribute in el.attrib]

    def lookup(self, path: str) -> Any:
        """One value at ``path``: the text of the element or attribute (None for an empty
        element), a list when the path selects several, ``MISSING`` when none."""
        found = [XmlText(v) if isinstance(v, str) else _text_or_none(v) for v in self.select(path)]
        if not found:
            return MISSING
        return found[0] if len(found) == 1 else found

    def as_flag(self, value: Any) -> Any:
        # xs:boolean's lexical forms.
        if isinstance(value, XmlText):
            if value.lower() in _TRUE:
                return True
            if value.lower() in _FALSE:
                return False
        return value

    def records(self, path: str, types: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """The elements at ``path``, each made a record (see the module)."""
        out = []
        for el in self.select(path):
            if not isinstance(el, ET.Element):
                raise contract_error("XML records", path, "elements", el)
            out.append(element_record(el, types))
        return out


def _text_or_none(el: ET.Element) -> XmlText | None:
    text = (el.text or "").strip()
    return XmlText(text) if text else None


def is_xml_path(path: str) -> bool:
    return path.strip().startswith(".")


def split_path(path: str) -> tuple[str, str | None]:
    """``./a/b/@c`` → (``./a/b``, ``c``); a path without a trailing attribute → (path, None)."""
    path = path.strip()
    head, sep, tail = path.rpartition("/@")
    if sep and tail and "/" not in tail and "[" not in tail:
        return head or ".", tail
    return path, None


@cache
def check_xml_path(path: str) -> str:
    """``path`` as an XML path, or ValueError saying why it is not one."""
    if not is_xml_path(path):
        raise ValueError("an XML path starts with '.' (the root element), e.g. ./channel/item")
    element_path, attribute = split_path(path)
    if attribute is not None and not attribute.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"not an attribute name: @{attribute}")
    if element_path != ".":
        try:
            ET.Element("x").findall(element_path)
        except (SyntaxError, KeyError, TypeError):
            raise ValueError(
                "not an XML path (ElementTree's XPath subset: ./a/b, .//c, ./a[@k='v'], ./a/@k)"
            ) from None
    return path


def local(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def element_record(el: ET.Element, types: dict[str, str] | None = None) -> dict[str, Any]:
    """One element as a record (see the module); ``types``: the record model's field
    types, by which text is converted."""
    out: dict[str, Any] = {f"@{local(k)}": v for k, v in el.attrib.items()}
    repeated: set[str] = set()
    for child in el:
        name = local(child.tag)
        value: Any = (
            element_record(child)
            if len(child) or child.attrib
            else ((child.text or "").strip() or None)
        )
        if name in out:
            if name not in repeated:
                out[name] = [out[name]]
                repeated.add(name)
            out[name].append(value)
        else:
            out[name] = value
    text = (el.text or "").strip()
    if text:
        out["#text"] = text
    return _typed(out, types) if types else out


def base_types(fields: dict[str, str] | None) -> dict[str, str]:
    """A record model's fields as their base type: ``int | None`` → ``int``,
    ``list[str]`` → ``list``."""
    out = {}
    for name, spelled in (fields or {}).items():
        parts = [p.strip() for p in str(spelled).split("|") if p.strip() != "None"]
        if parts:
            out[name] = "list" if parts[0].startswith("list") else parts[0]
    return out


_TRUE, _FALSE = ("true", "1"), ("false", "0")


def _convert(value: Any, kind: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        return value
    if kind == "bool":
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
    return value


def _typed(record: dict[str, Any], types: dict[str, str]) -> dict[str, Any]:
    for name, kind in types.items():
        if name not in record or record[name] is None:
            continue
        value = record[name]
        if kind == "list":
            record[name] = value if isinstance(value, list) else [value]
        elif isinstance(value, list):
            record[name] = [_convert(v, kind) for v in value]
        else:
            record[name] = _convert(value, kind)
    return record


# How deep elements may nest in an answer: far past any record a source serves, and far
# inside what the recursive readers (records, paths, pickling) can walk.
MAX_XML_DEPTH = 256


def _refuse(*_: Any) -> None:
    raise _Refused


class _Refused(Exception):
    pass


class _TooDeep(Exception):
    pass


def _name(raw: str) -> str:
    # expat with a namespace separator of "}" reports "uri}local"; ElementTree spells it
    # "{uri}local".
    return "{" + raw if "}" in raw else raw


def _builder_handlers(parser: Any, builder: ET.TreeBuilder) -> None:
    """Elements go to ``builder``; one nested past MAX_XML_DEPTH stops the parse."""
    depth = 0

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal depth
        depth += 1
        if depth > MAX_XML_DEPTH:
            raise _TooDeep
        builder.start(_name(tag), {_name(k): v for k, v in attrs.items()})

    def end(tag: str) -> None:
        nonlocal depth
        depth -= 1
        builder.end(_name(tag))

    parser.StartElementHandler = start
    parser.EndElementHandler = end


def parse_xml(body: bytes, what: str) -> XmlDocument:
    """An XML answer as a document; SOURCE_CONTRACT when it is not well-formed XML,
    declares entities or nests elements deeper than MAX_XML_DEPTH."""
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate(namespace_separator="}")
    parser.buffer_text = True
    _builder_handlers(parser, builder)
    parser.CharacterDataHandler = builder.data
    # Entity declarations are how an answer grows without bound (nested expansions) or
    # reaches out (external entities): none is accepted, as defusedxml does.
    parser.EntityDeclHandler = _refuse
    parser.UnparsedEntityDeclHandler = _refuse
    parser.ExternalEntityRefHandler = _refuse  # type: ignore[assignment]
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    try:
        parser.Parse(body, True)
        root = builder.close()
    except _Refused:
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"{what}: the XML answer declares entities, which are not accepted",
        ) from None
    except _TooDeep:
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"{what}: the XML answer nests elements deeper than {MAX_XML_DEPTH} levels "
            "(the bound of an answer's depth)",
            details={"limit": MAX_XML_DEPTH},
        ) from None
    except (expat.ExpatError, AssertionError, IndexError) as e:
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT, f"{what}: the answer is not well-formed XML ({e})"
        ) from None
    return XmlDocument(root)
