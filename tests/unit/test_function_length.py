"""The 60-line rule (infra/lint_length.py) holds for the product's packages."""

from __future__ import annotations

from pathlib import Path

from infra.lint_length import LIMIT, functions, too_long


def test_no_function_runs_past_the_limit():
    over = [f"{where}: {name} is {lines} lines" for lines, where, name in too_long()]
    assert not over, f"functions over {LIMIT} lines:\n" + "\n".join(over)


def test_the_rule_sees_a_long_function_and_its_decorators(tmp_path: Path):
    package = tmp_path / "artemis"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT - 2))
    method = "\n".join(f"        x{i} = {i}" for i in range(LIMIT))
    (package / "m.py").write_text(
        f"import functools\n\n@functools.cache\ndef fits():\n{body}\n\n"
        f"class C:\n    def long(self):\n{method}\n"
    )
    found = {name: lines for lines, _, name in functions(tmp_path)}
    assert found["fits"] == LIMIT  # decorator and def line counted
    assert found["C.long"] == LIMIT + 1
    assert [name for _, _, name in too_long(tmp_path)] == ["C.long"]
