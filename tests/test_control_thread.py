"""The main's control thread: work runs on its own loop and thread, its owner
learns whether it really ended before closing what it uses, and a change it
hands to the gateway's loop is awaited without stopping its own."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from letsinfer.control.thread import ControlThread, LoopPost
from letsinfer.node import MainNode


def test_work_runs_on_the_control_thread_and_stop_says_it_ended() -> None:
    async def scenario() -> tuple[str, str, bool]:
        control = ControlThread(name="control-under-test")

        async def where() -> str:
            return threading.current_thread().name

        await control.start(where)
        there = await control.run(where)
        torn_down: list[str] = []

        async def teardown() -> None:
            torn_down.append(threading.current_thread().name)

        ended = await control.stop(teardown)
        return there, torn_down[0], ended

    there, torn_down, ended = asyncio.run(scenario())
    assert there == torn_down == "control-under-test"
    assert ended


def test_stop_says_so_when_the_thread_is_still_busy() -> None:
    """A task's last write as the loop ends (the denial log flushes when it is
    cancelled) blocked on the database by another process holding its lock
    keeps the thread past the wait: the owner must not close its connection."""

    async def scenario() -> tuple[bool, bool]:
        control = ControlThread()
        started = threading.Event()

        async def flushes_when_cancelled() -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            finally:
                time.sleep(1.5)  # a synchronous call, as sqlite's are

        async def setup() -> None:
            control.spawn(flushes_when_cancelled)

        async def nothing() -> None:
            return None

        await control.start(setup)
        await asyncio.to_thread(started.wait, 5)
        # Nothing but the control thread holds the task: a collection here
        # must not end it (it once did, now and then, in CI).
        gc.collect()
        ended = await control.stop(nothing, join_s=0.2)
        thread = control._thread
        assert thread is not None
        await asyncio.to_thread(thread.join, 10)
        return ended, thread.is_alive()

    ended, alive_after = asyncio.run(scenario())
    assert not ended
    assert not alive_after


@contextlib.contextmanager
def busy_gateway() -> Iterator[tuple[asyncio.AbstractEventLoop, threading.Event]]:
    """A gateway's loop on its own thread, held in one long turn until the
    event it yields is set (at the latest when the block ends)."""
    gateway = asyncio.new_event_loop()
    runner = threading.Thread(target=gateway.run_forever, name="gateway-under-test")
    runner.start()
    in_turn, release = threading.Event(), threading.Event()

    def long_turn() -> None:
        in_turn.set()
        release.wait(5)

    try:
        gateway.call_soon_threadsafe(long_turn)
        assert in_turn.wait(5)
        yield gateway, release
    finally:
        release.set()
        gateway.call_soon_threadsafe(gateway.stop)
        runner.join(10)
        gateway.close()


def test_a_controller_s_change_waits_for_a_busy_gateway_without_stopping_the_control_loop() -> None:
    """The control plane answers a controller's change only once the gateway's
    loop has applied it; meanwhile the control thread's loop must go on with
    every node's handshakes and reports, however long the gateway's turn."""
    applied: list[str] = []

    async def nothing() -> None:
        return None

    with busy_gateway() as (gateway, release):
        node = SimpleNamespace(
            post=LoopPost(gateway),
            apply_now=lambda: applied.append(threading.current_thread().name),
        )

        async def change_while_the_gateway_is_busy() -> tuple[int, list[str]]:
            change = asyncio.ensure_future(MainNode._apply_from_control(node))  # type: ignore[arg-type]
            ticks = 0  # turns of the control loop while the change waits
            for _ in range(20):  # what else the control loop runs meanwhile
                await asyncio.sleep(0.01)
                ticks += not change.done()
            applied_before = list(applied)
            release.set()
            await change
            return ticks, applied_before

        async def scenario() -> tuple[int, list[str]]:
            control = ControlThread(name="control-under-test")
            await control.start(nothing)
            try:
                return await control.run(change_while_the_gateway_is_busy)
            finally:
                await control.stop(nothing)

        ticks, applied_before = asyncio.run(scenario())
    assert ticks == 20  # every turn of the control loop ran while the change waited,
    assert applied_before == []  # which waited for the gateway's turn to end,
    assert applied == ["gateway-under-test"]  # and then ran on the gateway's loop


def test_a_change_whose_waiter_gave_up_still_applies(caplog: pytest.LogCaptureFixture) -> None:
    """A controller that hangs up (or a timeout) cancels the wait, not the
    change: the store has it already, and the gateway must apply it too."""
    applied = threading.Event()
    with busy_gateway() as (gateway, release):
        waiting = LoopPost(gateway).submit(applied.set)
        assert waiting.cancel()  # the waiter gives up while the gateway is busy
        release.set()
        assert applied.wait(5)
    assert "failed" not in caplog.text
