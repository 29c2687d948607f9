"""An attempt's heartbeats start after the throttle interval (activities/run_base.py
Heartbeat): a short attempt sends none; a long one sends from then on. Run in the SDK's
own activity environment, which records what an activity hands to Temporal."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta

from temporalio.testing import ActivityEnvironment

from activities.run_base import Heartbeat, beating_meanwhile


def test_a_short_attempt_sends_no_heartbeat_a_long_one_sends_after_the_interval() -> None:
    sent: list[tuple] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: sent.append(details)

    made: dict[int, float] = {}  # call → seconds since the attempt began

    async def attempt(first_after_s: float, calls: int, every_s: float) -> None:
        began = time.monotonic()
        beat = Heartbeat(first_after_s)
        for n in range(calls):
            made[n] = time.monotonic() - began
            beat({"page": n})
            await asyncio.sleep(every_s)  # the pace of an attempt's pages, not a wait

    # Ends well inside its interval: nothing is sent.
    asyncio.run(env.run(attempt, 30.0, 5, 0.0))
    assert sent == []

    # Beats on past its interval: the latest call made inside it goes at its end, every
    # call after it goes, in order; none of the earlier calls goes.
    made.clear()
    asyncio.run(env.run(attempt, 0.3, 40, 0.02))
    pages = [details[0]["page"] for details in sent]
    assert pages, "no heartbeat was sent"
    assert pages == list(range(pages[0], 40))
    assert pages[0] > 0 and made[pages[0] - 1] < 0.3
    assert all(made[p] >= 0.3 for p in pages[1:])


def test_a_heartbeat_held_in_the_interval_goes_at_its_end_without_another_call() -> None:
    sent: list[tuple[float, tuple]] = []
    env = ActivityEnvironment()
    began = time.monotonic()
    env.on_heartbeat = lambda *details: sent.append((time.monotonic() - began, details))

    async def attempt() -> None:
        beat = Heartbeat(0.2)
        beat({"page": 1})
        beat({"page": 2})  # the latest replaces the one held
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    asyncio.run(env.run(attempt))
    assert [details for _, details in sent] == [({"page": 2},)]
    assert sent[0][0] >= 0.2


def test_no_interval_sends_every_heartbeat() -> None:
    sent: list[tuple] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: sent.append(details)

    def attempt() -> None:
        beat = Heartbeat(0)
        for n in range(3):
            beat(n)

    env.run(attempt)
    assert [d[0] for d in sent] == [0, 1, 2]


def test_the_first_heartbeat_comes_before_half_the_heartbeat_timeout() -> None:
    sent: list[tuple] = []
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.2))
    env.on_heartbeat = lambda *details: sent.append(details)

    async def attempt() -> float:
        began = time.monotonic()
        beat = Heartbeat(30.0)  # a throttle longer than the timeout allows
        while not sent:
            beat("alive")
            await asyncio.sleep(0.01)
            if time.monotonic() - began > 5:
                break
        return time.monotonic() - began

    took = asyncio.run(env.run(attempt))
    assert sent, "no heartbeat within 5 s under a 0.2 s heartbeat timeout"
    assert took >= 0.1


def test_a_page_slower_than_the_heartbeat_timeout_keeps_its_attempt_alive() -> None:
    """``beating_meanwhile``: while one page takes three heartbeat timeouts (a slow source,
    a large answer read up to its limit), the attempt's latest state goes on being sent,
    at most a third of the timeout apart; none after it is stopped; a local activity
    (no heartbeat) sends none."""
    sent: list[tuple[float, tuple]] = []
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.3))
    began = time.monotonic()
    env.on_heartbeat = lambda *details: sent.append((time.monotonic() - began, details))

    async def attempt() -> int:
        state = {"next_seq": 4}
        beat = Heartbeat(0)
        stop = beating_meanwhile(lambda: beat(state))
        deadline = time.monotonic() + 30
        while len(sent) < 4 and time.monotonic() < deadline:  # the slow page
            await asyncio.sleep(0.01)
        stop()
        count = len(sent)
        await asyncio.sleep(0.3)  # a whole timeout after the stop: nothing more goes
        return count

    count = asyncio.run(env.run(attempt))
    assert len(sent) == count >= 4, sent
    assert all(details == ({"next_seq": 4},) for _, details in sent)
    assert sent[0][0] >= 0.09  # the first after a third of the timeout, not at once

    env.info = dataclasses.replace(env.info, is_local=True)
    sent.clear()

    async def local_attempt() -> None:
        stop = beating_meanwhile(lambda: sent.append((0.0, ("beat",))))
        await asyncio.sleep(0.35)  # longer than a third of the timeout: none may go
        stop()

    asyncio.run(env.run(local_attempt))
    assert sent == []
