"""The main's control thread: work runs on its own loop and thread, and its
owner learns whether it really ended before closing what it uses."""

from __future__ import annotations

import asyncio
import threading
import time

from letsinfer.control.thread import ControlThread


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
        ended = await control.stop(nothing, join_s=0.2)
        thread = control._thread
        assert thread is not None
        await asyncio.to_thread(thread.join, 10)
        return ended, thread.is_alive()

    ended, alive_after = asyncio.run(scenario())
    assert not ended
    assert not alive_after
