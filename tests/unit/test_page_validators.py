"""A page's validators (artemis/sinks/records.py): built once per record model and kept,
although every run makes its RecordSpec anew; the strict one and the lax one stay apart."""

from __future__ import annotations

import pytest

from artemis.errors import ArtemisError
from artemis.sinks.records import RecordSpec, declared_spec
from artemis.tasks.registry import get_task

DECL = {"key": ["id"], "fields": {"id": "int", "price": "float | None"}}


def test_each_run_s_spec_reuses_the_model_s_validators() -> None:
    task = get_task("pull_stock_quotes")
    first = RecordSpec(task.Record, task.record_key)
    second = RecordSpec(task.Record, task.record_key)
    assert first is not second
    assert first.adapter is second.adapter
    assert first.lax_adapter is second.lax_adapter
    assert first.adapter is not first.lax_adapter


def test_the_kept_validators_stay_strict_and_lax() -> None:
    spec = declared_spec(DECL, "PriceRecord")
    again = declared_spec(DECL, "PriceRecord")
    assert spec.adapter is again.adapter
    assert spec.rows([{"id": 1, "price": 1.5}], "page 1") == [{"id": 1, "price": 1.5}]
    with pytest.raises(ArtemisError) as caught:
        spec.rows([{"id": 1, "price": "1.5"}], "page 1")
    assert "page 1: record 0" in caught.value.message
    assert "column 'price'" in caught.value.message
    lax = spec.lax_adapter.validate_python([{"id": "7", "price": "1.5"}])
    assert (lax[0].id, lax[0].price) == (7, 1.5)
