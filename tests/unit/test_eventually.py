"""The tests' own wait (tests/helpers.py: eventually): a transient Temporal error is
"not yet", any other error fails the test at once, and a deadline names what never came."""

from __future__ import annotations

import pytest
from temporalio.service import RPCError, RPCStatusCode

from tests.helpers import eventually


async def test_a_transient_server_error_is_not_yet():
    calls = 0

    async def check() -> str | None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")
        return "ready"

    assert await eventually(check, "the answer", timeout=10, interval=0) == "ready"
    assert calls == 3


async def test_another_server_error_fails_at_once():
    calls = 0

    def check() -> None:
        nonlocal calls
        calls += 1
        raise RPCError("no such queue", RPCStatusCode.NOT_FOUND, b"")

    with pytest.raises(RPCError, match="no such queue"):
        await eventually(check, "the answer", timeout=10, interval=0)
    assert calls == 1


async def test_the_deadline_names_the_wait_and_the_last_server_error():
    def check() -> None:
        raise RPCError("server busy", RPCStatusCode.UNAVAILABLE, b"")

    with pytest.raises(pytest.fail.Exception, match="the answer.*server busy"):
        await eventually(check, "the answer", timeout=0.2, interval=0.01)
