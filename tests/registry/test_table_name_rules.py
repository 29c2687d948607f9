"""Two provenances never share a table (artemis/registry/yaml_io.py): a code whose default
table is another's whatever its case (SQLite's names ignore case), or past the 63 bytes
PostgreSQL keeps of a name, is refused at import naming both, or the name and its
length; ``artemis registry check`` finds those written before the rule."""

from __future__ import annotations

import pytest
import yaml

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.writes import check_registry
from artemis.registry.yaml_io import import_yaml
from tests.registry.test_resolution import add_provenance


def doc(code: str) -> str:
    return yaml.safe_dump(
        {"provenance": {"provenance_code": code, "base_url_default": "https://shop.example"}}
    )


@pytest.mark.parametrize(
    ("first", "second", "said"),
    [
        ("shop", "Shop", "its default table 'Shop' is provenance 'shop''s ('shop': table names"),
        ("my-shop", "MY.SHOP", "its default table 'MY_SHOP' is provenance 'my-shop''s"),
        ("my_shop", "my-shop", "its default table 'my_shop' is provenance 'my_shop''s ('my_shop')"),
    ],
)
def test_a_code_whose_table_is_another_provenances_whatever_its_case_is_refused(
    reg, key_file, first, second, said
):
    import_yaml(reg, doc(first), key_file)
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, doc(second), key_file)
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert said in e.value.message and "pick another code" in e.value.message


@pytest.mark.parametrize(
    ("code", "table", "size"),
    [("a" * 64, "a" * 64, 64), ("9" + "b" * 61, "t_9" + "b" * 61, 64)],
)
def test_a_code_whose_table_postgresql_would_cut_is_refused_naming_its_length(
    reg, key_file, code, table, size
):
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, doc(code), key_file)
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert f"table name {table!r} is {size} bytes: PostgreSQL keeps 63" in e.value.message
    import_yaml(reg, doc(code[:-1]), key_file)  # 63 bytes: one name in both databases


def test_the_registry_check_finds_tables_shared_before_the_rule(reg):
    with reg.begin() as conn:  # written around the import (by hand, or by an older one)
        add_provenance(conn, "Books")
        add_provenance(conn, "books")
        add_provenance(conn, "c" * 64)
    with reg.connect() as conn:
        found = {(f["kind"], f["message"]) for f in check_registry(conn)}
    assert (
        "shared_table",
        "provenance books: its default table 'books' is provenance Books's (names are one "
        "whatever their case): map one of them to a table of its own "
        "(output_defaults.<code>.sql.tables)",
    ) in found
    assert any(k == "table_name" and "is 64 bytes" in m for k, m in found)
