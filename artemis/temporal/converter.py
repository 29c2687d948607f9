"""The payload converter: Temporal's default, with dataclass decoding that resolves each
class's type hints once.

The SDK's JSON converter rebuilds a dataclass from its JSON with ``value_to_type``, which
calls ``typing.get_type_hints`` on the class for every payload and every nested
dataclass: evaluating the string annotations (``from __future__ import annotations``)
anew each time. On a small run that was 7 % of the worker's event-loop time
(docs/performance.md). ``DataclassFields`` is a custom type converter, the SDK's own
extension point, tried before the default conversion: the same rules (unknown keys ignored, a
missing field left to the class's default or its ``TypeError``, ``init=False`` fields
restored after construction), with the hints of each class resolved once per process.

Encoding: the SDK's ``AdvancedJSONEncoder`` turns a dataclass into a dict with
``dataclasses.asdict``, a deep copy of every nested value, before the C encoder writes
it. ``DataclassEncoder`` hands the encoder the dataclass's fields as they are (a shallow
dict, nested dataclasses met in turn), in a third of the time (a run's request: 0.043 →
0.014 ms). The JSON is the SDK's, byte for byte, for what the run models hold (tested).
Where it is not: a set is written in its own order (the SDK's deep copy may rebuild it in
another: the same set), and a dataclass that subclasses dict, list, tuple, str, int or
float, met inside another value, would be written as that type (the encoder takes it
natively; ``asdict`` recursed into its fields) — none of the payload models does (tested).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from typing import Any

from temporalio.converter import (
    AdvancedJSONEncoder,
    CompositePayloadConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    JSONTypeConverter,
    value_to_type,
)

_FIELDS = "__artemis_fields__"


# ``as_is`` of a field hinted ``Any``: every value is taken as it is.
_ANY: frozenset[type] = frozenset({object})
_NUMBERS = (int, float, bool)


def as_is(hint: Any) -> frozenset[type] | None:
    """The JSON value types ``value_to_type`` gives back unchanged for ``hint`` (a dict or
    a list: as an equal copy), so that a field's value of one of them is taken without
    the call; None when every value goes through it. Plain scalars, ``Any``, ``dict`` /
    ``dict[str, Any]``, ``list`` / ``list[Any]``, and unions of them with at most one of
    int, float and bool (the SDK tries a union's members in order, and ``int`` takes a
    bool or a float too: their order would matter) and no list next to another member
    but None (the SDK's list takes any iterable: a string, a dict's keys)."""
    if hint is Any:
        return _ANY
    if hint in (str, int, float, bool, type(None)):
        return frozenset({hint})
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is dict or (origin is dict and args == (str, Any)):
        return frozenset({dict})
    if hint is list or (origin is list and args == (Any,)):
        return frozenset({list})
    if origin is typing.Union or origin is types.UnionType:
        parts = [as_is(a) for a in args]
        if any(p is None or p is _ANY for p in parts):
            return None
        if sum(a in _NUMBERS for a in args) > 1:
            return None
        if any(p == frozenset({list}) for p in parts) and len(args) - (type(None) in args) > 1:
            return None  # the SDK's list branch takes any iterable: a str, a dict's keys
        return frozenset().union(*typing.cast(list[frozenset[type]], parts))
    return None


def _fields(cls: type) -> tuple[tuple[str, Any, bool, frozenset[type] | None], ...]:
    """(name, resolved hint, init, ``as_is``) of each field of a dataclass, resolved once
    and kept on the class itself: a sandboxed worker or a replayer imports the workflow's
    modules afresh for each run, and a cache keyed by class would keep every such copy
    alive. Read from the class's own ``__dict__`` so that a subclass resolves its own."""
    cached = cls.__dict__.get(_FIELDS)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = tuple(
            (f.name, hints[f.name], f.init, as_is(hints[f.name])) for f in dataclasses.fields(cls)
        )
        setattr(cls, _FIELDS, cached)
    return cached


class DataclassFields(JSONTypeConverter):
    """Dataclasses from their JSON objects, with each class's type hints cached."""

    def to_typed_value(self, hint: type, value: Any) -> Any | None:
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            return JSONTypeConverter.Unhandled
        if issubclass(hint, collections.abc.Mapping):
            return JSONTypeConverter.Unhandled  # the SDK decodes a mapping first
        if not isinstance(value, dict):
            raise TypeError(f"Cannot convert to dataclass {hint}, value is {type(value)} not dict")
        init: dict[str, Any] = {}
        late: dict[str, Any] = {}
        for name, field_hint, in_init, plain in _fields(hint):
            if name not in value:
                continue
            raw = value[name]
            if plain is not None and (plain is _ANY or type(raw) in plain):
                converted = raw  # what value_to_type would give (see ``as_is``)
            else:
                try:
                    converted = value_to_type(field_hint, raw, _CONVERTERS)
                except Exception as err:
                    raise TypeError(f"Failed converting field {name} on dataclass {hint}") from err
            (init if in_init else late)[name] = converted
        obj = hint(**init)
        for name, v in late.items():
            object.__setattr__(obj, name, v)
        return obj


_CONVERTERS: tuple[JSONTypeConverter, ...] = (DataclassFields(),)

_NAMES = "__artemis_field_names__"


class DataclassEncoder(AdvancedJSONEncoder):
    """``AdvancedJSONEncoder`` with a dataclass given as a shallow dict of its fields
    (what ``dataclasses.asdict`` gives, without copying every value on the way)."""

    def default(self, o: Any) -> Any:
        cls = type(o)
        names = cls.__dict__.get(_NAMES)
        if names is None:
            if not dataclasses.is_dataclass(cls):
                return super().default(o)
            names = tuple(f.name for f in dataclasses.fields(cls))
            setattr(cls, _NAMES, names)
        return {name: getattr(o, name) for name in names}


# Temporal's default encoding converters, the JSON one given DataclassFields.
_ENCODING_CONVERTERS = tuple(
    JSONPlainPayloadConverter(encoder=DataclassEncoder, custom_type_converters=_CONVERTERS)
    if isinstance(c, JSONPlainPayloadConverter)
    else c
    for c in DefaultPayloadConverter.default_encoding_payload_converters
)


_BY_ENCODING = {c.encoding.encode(): c for c in _ENCODING_CONVERTERS}


class ArtemisPayloadConverter(CompositePayloadConverter):
    """Temporal's default payload converters, the JSON one with ``DataclassFields``.

    The SDK builds one for every workflow activation (its data converter per serialization
    context); they share one read-only map of the converters (the SDK's constructor builds
    it afresh: 0.7 % of a bench worker's loop)."""

    def __init__(self) -> None:
        self.converters = _BY_ENCODING
