"""The payload converter (artemis/temporal/converter.py): dataclasses decode exactly as
Temporal's default converter decodes them, from the same JSON, with each class's type
hints resolved once; and the client installs Temporal's tracing interceptor only when spans
are exported."""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import inspect
import pkgutil
import typing
import uuid
from dataclasses import dataclass, field

import pytest
from temporalio.converter import DataConverter, DefaultPayloadConverter, value_to_type

from artemis import run_models, run_state
from artemis.ledger import Ledger
from artemis.run_models import (
    FetchInput,
    FetchResult,
    RunRef,
    RunRequest,
    RunTuning,
)
from artemis.run_state import CircuitBreaker, FetchRetry, RunState, RunStatus
from artemis.temporal import converter as conv
from artemis.temporal.client import data_converter
from artemis.tracing import TraceContext

OURS = conv.ArtemisPayloadConverter()
DEFAULT = DefaultPayloadConverter()


@dataclass
class _Inner:
    n: int
    tags: list[str] = field(default_factory=list)


@dataclass
class _Outer:
    name: str
    inner: _Inner | None = None
    many: dict[str, _Inner] = field(default_factory=dict)
    late: int = field(default=0, init=False)


def _roundtrip(value: object, hint: type) -> tuple[object, object]:
    payloads = DEFAULT.to_payloads([value])
    return (
        OURS.from_payloads(payloads, [hint])[0],
        DEFAULT.from_payloads(payloads, [hint])[0],
    )


def test_nested_optional_mapping_and_init_false_fields_decode_as_the_default_does():
    value = _Outer("a", _Inner(1, ["x"]), {"k": _Inner(2)})
    value.late = 7
    ours, default = _roundtrip(value, _Outer)
    assert ours == default == value
    assert isinstance(ours, _Outer) and isinstance(ours.inner, _Inner)
    assert ours.late == 7  # an init=False field is restored after construction


def test_the_run_models_round_trip_like_the_default():
    ref = RunRef("pull_stock_quotes", "t1", "artemis/pull_stock_quotes/t1", "a" * 32, "b" * 16)
    req = RunRequest(
        task_code="pull_stock_quotes",
        task_id="t1",
        params={"symbols": ["AC1"]},
        trace_id="a" * 32,
        output={"sinks": ["http"]},
        tuning=RunTuning(pages_per_fetch=7),
        carry=RunState(
            params={"symbols": ["AC1"]},
            total=1,
            checkpoint={"page": 2},
            next_seq=2,
            stats={"records": 4},
            steps={"fetch": "done"},
            started_ms=1_700_000_000_000,
            fetch_retry=FetchRetry(),
            breaker=CircuitBreaker(3, 10.0),
            undelivered=[[3, 5]],
            status=RunStatus.RUNNING,
        ),
    )
    for value, hint in (
        (req, RunRequest),
        (ref, RunRef),
        (
            FetchResult(
                *(0, 3, 3, 9, {"page": 3}, True, 1),
                streamed=Ledger(0, 3, records_in=9, records_out=9, records_emitted=9, batches=1),
            ),
            FetchResult,
        ),
        (FetchInput(ref, {"a": 1}, None, 0, 200, 60.0, 3, 0, qps=2.5), FetchInput),
        (TraceContext("a" * 32, "b" * 16, None, False), TraceContext),
    ):
        ours, default = _roundtrip(value, hint)
        assert ours == default == value, hint


def test_no_payload_dataclass_is_also_a_json_native_type():
    """DataclassEncoder writes a nested dataclass that is also a dict, list, tuple, str,
    int or float as that type (the SDK wrote its fields): none of the payload models is."""
    import activities
    import artemis
    import workflows

    seen = 0
    for package in (artemis, activities, workflows):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if isinstance(obj, type) and dataclasses.is_dataclass(obj):
                    seen += 1
                    assert not issubclass(obj, (dict, list, tuple, str, int, float)), obj
    assert seen > 20


def test_dataclasses_encode_to_the_defaults_bytes():
    """The shallow dataclass encoder writes what the SDK's encoder (``asdict``) writes,
    byte for byte: nested and optional dataclasses, mappings and lists of them, fields
    without ``init``, a subclass's own fields, datetimes, sets and non-ASCII text."""
    import datetime as dt

    @dataclass
    class _Sub(_Outer):
        extra: tuple[int, ...] = (1, 2)

    ref = RunRef("pull_stock_quotes", "t1", "artemis/pull_stock_quotes/t1", "a" * 32, "b" * 16)
    values = [
        _Outer("a", _Inner(1, ["x"]), {"k": _Inner(2)}),
        _Sub("ü—名", None, {}),
        RunRequest(
            task_code="pull_stock_quotes",
            task_id="t1",
            params={"symbols": ["AC1"], "at": dt.datetime(2026, 1, 2, tzinfo=dt.UTC)},
            trace_id="a" * 32,
            output={"sinks": ["http"], "n": 1.5},
            tuning=RunTuning(pages_per_fetch=7),
        ),
        FetchInput(ref, {"a": 1}, None, 0, 200, 60.0, 3, 0, qps=2.5),
        [ref, {"nested": [ref]}, {3, 1}],
    ]
    late = _Outer("b")
    late.late = 7
    values.append(late)
    for value in values:
        assert OURS.to_payloads([value])[0].data == DEFAULT.to_payloads([value])[0].data


def test_unknown_keys_are_ignored_and_missing_required_fields_fail():
    p = DEFAULT.to_payloads([{"n": 1, "extra": True}])
    assert OURS.from_payloads(p, [_Inner])[0] == _Inner(1)
    missing = DEFAULT.to_payloads([{"tags": []}])
    with pytest.raises(TypeError):
        OURS.from_payloads(missing, [_Inner])
    wrong = DEFAULT.to_payloads([{"n": "one"}])
    with pytest.raises(TypeError, match="field n"):
        OURS.from_payloads(wrong, [_Inner])


def test_type_hints_are_resolved_once_per_class(monkeypatch):
    for cls in (_Outer, _Inner):  # resolved by an earlier test, perhaps
        if conv._FIELDS in cls.__dict__:
            delattr(cls, conv._FIELDS)
    calls: list[type] = []
    real = typing.get_type_hints

    def counting(obj, *a, **k):
        calls.append(obj)
        return real(obj, *a, **k)

    monkeypatch.setattr(conv.typing, "get_type_hints", counting)
    payloads = DEFAULT.to_payloads([_Outer("a", _Inner(1))])
    for _ in range(5):
        OURS.from_payloads(payloads, [_Outer])
    assert calls.count(_Outer) == 1 and calls.count(_Inner) == 1


def test_a_subclass_resolves_its_own_fields():
    @dataclass
    class Child(_Inner):
        extra: str = "x"

    conv._fields(_Inner)
    assert [name for name, *_ in conv._fields(Child)] == ["n", "tags", "extra"]
    payloads = DEFAULT.to_payloads([Child(1, ["a"], "y")])
    assert OURS.from_payloads(payloads, [Child])[0] == Child(1, ["a"], "y")


def test_every_client_uses_it():
    dc = data_converter()
    assert isinstance(dc, DataConverter)
    assert dc.payload_converter_class is conv.ArtemisPayloadConverter


def test_every_run_model_dataclass_has_resolvable_hints():
    """The cache resolves hints at first use: a model whose annotations do not resolve
    would fail there, so every dataclass of run_models and run_state is checked up front."""
    classes = [
        c
        for module in (run_models, run_state)
        for _, c in inspect.getmembers(module, inspect.isclass)
        if dataclasses.is_dataclass(c) and c.__module__ == module.__name__
    ]
    assert len(classes) > 10
    for c in classes:
        assert conv._fields(c)


_SAMPLES: tuple[object, ...] = (
    "s",
    "",
    0,
    3,
    -1,
    1.5,
    2.0,
    True,
    False,
    None,
    {},
    {"a": 1},
    [],
    [1, "x"],
)


def test_a_value_taken_as_is_is_what_the_sdk_would_give():
    """``as_is`` (values taken without ``value_to_type``): for every field of every run
    model, and for a set of hints with unions whose order matters, a JSON value it takes
    as it is equals, type and all, what the SDK's conversion gives; and a value it does not
    take still goes through the SDK (a float field given an int, say)."""
    hints: list[object] = [
        int | None,
        float | None,
        bool | int,
        int | bool,
        float | int,
        str | int | None,
        dict[str, typing.Any] | None,
        list[typing.Any] | None,
        list[typing.Any] | str,
        dict[str, typing.Any] | list[typing.Any] | None,
        dict[str, int],
        list[str],
        typing.Any,
        typing.Optional[str],  # noqa: UP045 (the typing spelling, as older code writes it)
    ]
    for module in (run_models, run_state):
        for c in inspect.getmembers(module, inspect.isclass):
            if dataclasses.is_dataclass(c[1]) and c[1].__module__ == module.__name__:
                hints += [hint for _, hint, *_ in conv._fields(c[1])]
    taken = 0
    for hint in hints:
        plain = conv.as_is(hint)
        for value in _SAMPLES:
            if plain is None or not (plain is conv._ANY or type(value) in plain):
                continue
            taken += 1
            sdk = value_to_type(hint, value, conv._CONVERTERS)  # type: ignore[arg-type]
            assert sdk == value and type(sdk) is type(value), (hint, value, sdk)
    assert taken > 100
    assert conv.as_is(float) == frozenset({float})  # an int given goes through the SDK
    assert conv.as_is(int | bool) is None and conv.as_is(dict[str, int]) is None
    # the SDK's list takes any iterable: "abc" -> ['a', 'b', 'c'], a dict -> its keys
    assert conv.as_is(list[typing.Any] | str) is None and conv.as_is(list | dict) is None
    assert conv.as_is(list[typing.Any] | None) == frozenset({list, type(None)})


async def test_temporal_tracing_interceptor_only_when_spans_are_exported(temporal_server):
    from temporalio.contrib.opentelemetry import TracingInterceptor

    from artemis.config import load_settings
    from artemis.temporal.client import connect

    address = {"temporal": {"address": temporal_server.address}}
    quiet = await connect(load_settings(None, **address))
    assert not any(isinstance(i, TracingInterceptor) for i in quiet.config()["interceptors"])
    exported = await connect(load_settings(None, **address, telemetry={"exporter": "console"}))
    assert any(isinstance(i, TracingInterceptor) for i in exported.config()["interceptors"])
    # What the interceptor does: its header on the start (a workflow nothing polls).
    headers = {}
    for name, client in (("quiet", quiet), ("exported", exported)):
        handle = await client.start_workflow(
            "NothingPollsThis", id=f"tracing-{name}-{uuid.uuid4().hex}", task_queue="nobody"
        )
        started = (await handle.fetch_history()).events[0]
        headers[name] = set(started.workflow_execution_started_event_attributes.header.fields)
        await handle.terminate("test done")
    assert "_tracer-data" in headers["exported"]
    assert "_tracer-data" not in headers["quiet"]


def test_a_dataclass_that_is_a_mapping_decodes_as_the_sdk_decodes_it():
    """The SDK's value_to_type takes the mapping branch before the dataclass one."""

    @dataclass
    class Bag(collections.abc.Mapping):
        n: int = 0

        def __getitem__(self, key):
            return {"n": self.n}[key]

        def __iter__(self):
            return iter(["n"])

        def __len__(self):
            return 1

    payloads = DEFAULT.to_payloads([{"n": 2}])
    ours, default = (
        OURS.from_payloads(payloads, [Bag])[0],
        DEFAULT.from_payloads(payloads, [Bag])[0],
    )
    assert type(ours) is type(default) is dict and ours == default
