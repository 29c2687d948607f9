"""The import rules (infra/lint_imports.py): no circle among the product's modules,
whatever closes it (a top-level import, one inside a function, one under TYPE_CHECKING),
and the layers one way (the domain never imports the dev stack, a worker, an activity or
a workflow; the starter never a worker or the dev stack)."""

from __future__ import annotations

from infra.lint_imports import circles, crossings, graph


def test_the_product_has_no_import_circle_and_no_import_across_a_layer():
    edges = graph()
    assert circles(edges) == []
    assert crossings(edges) == []


def test_a_circle_closed_by_a_type_only_or_a_late_import_is_found(tmp_path):
    pkg = tmp_path / "artemis"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from artemis.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from artemis.c import C\n"
    )
    (pkg / "c.py").write_text("def f():\n    from artemis import a\n")
    (pkg / "d.py").write_text("from . import c\n")  # relative, and into no circle
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "__init__.py").write_text("")
    (pkg / "e.py").write_text("import infra\n")
    edges = graph(tmp_path)
    assert edges["artemis.d"] == {"artemis.c"}
    assert circles(edges) == [["artemis.a", "artemis.c", "artemis.sub.b"]]
    assert crossings(edges) == ["artemis.e -> infra"]
