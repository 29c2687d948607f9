"""The parameter rule (infra/lint_params.py): at most 6 parameters a function (``self`` and
``cls`` not counted, keyword-only ones counted); values that travel together go as one
object."""

from __future__ import annotations

from infra.lint_params import LIMIT, parameters


def test_no_function_takes_more_parameters_than_the_limit():
    past = sorted((where, name, n) for n, where, name in parameters() if n > LIMIT)
    assert not past, f"past {LIMIT} parameters: {past}"


def test_a_command_or_a_route_is_its_interface_and_other_functions_count(tmp_path):
    from infra import lint_params

    pkg = tmp_path / "artemis"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def seven(a, b, c, d, e, f, *, g): ...\n"
        "class C:\n    def six(self, a, b, c, d, e, f): ...\n"
        "def command(a=typer.Option(1), b=1, c=1, d=1, e=1, f=1, g=1): ...\n"
        "def route(a, b, c, d, e, f, g=Query(None)): ...\n"
    )
    counted = {name: n for n, _, name in lint_params.parameters(tmp_path)}
    assert counted == {"seven": 7, "six": 6}
