"""CLI error messages are plain text: brackets in them are shown as they are."""

from __future__ import annotations

import io

import pytest
import typer

from starter.cli import _common


def test_an_error_message_with_brackets_is_printed_as_it_is(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(_common.err_console, "file", out)
    with pytest.raises(typer.Exit):
        _common._fail("params.symbols: expected list[str], got '[bold]x'")
    assert out.getvalue().strip() == "error: params.symbols: expected list[str], got '[bold]x'"
