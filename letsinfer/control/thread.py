"""The main's control plane runs on a thread and event loop of its own.

TLS handshakes, facts verification and the authority's SQLite writes for a
thousand nodes must not stall the gateway's event loop: a request waiting on
that loop waits for whatever else it runs. So the control and agent planes,
the nodes' reports and the background work about remote nodes run on the
control thread (:class:`ControlThread`), with a store connection of its own;
the gateway, the main's own engines and the admin socket stay on the
gateway's loop, with theirs.

Between them:

- routing changes decided on the control thread run on the gateway's loop,
  which owns the routing table: :class:`LoopPost` queues them and wakes that
  loop once per batch (not once per change), in order;
- the gateway's loop asks the control thread for work with
  :meth:`ControlThread.run` (a node's removal) and waits without blocking;
- snapshots both read (the key and model directory, the cluster view) are
  immutable objects swapped whole.

Each waits on the other only by awaiting (the control thread for a
controller's change applied before it answers, the gateway for a node's
removal), so neither loop stops serving while the other is busy, and neither
can deadlock the other.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger("letsinfer.control")

T = TypeVar("T")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # as uvicorn's "auto" picks for the gateway
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()  # type: ignore[no-any-return]


class LoopPost:
    """Run callables on ``loop`` (another thread's), in the order posted; one
    wake-up of that loop per batch of them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def __call__(self, change: Callable[[], None]) -> None:
        with self._lock:
            self._queue.append(change)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # that loop is closed: the node is stopping
            with self._lock:
                self._scheduled = False

    def _drain(self) -> None:
        with self._lock:
            batch = list(self._queue)
            self._queue.clear()
            self._scheduled = False
        for change in batch:
            try:
                change()
            except Exception:  # one bad change must not drop the others
                log.exception("a routing change from the control plane failed")

    def submit(self, change: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``change`` on that loop; its result, for a thread other than that
        loop's to await (``asyncio.wrap_future``) rather than block on."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            # A waiter that gave up (its client left, or a timeout) cancelled
            # the future: the change still applies, with no one to tell.
            wanted = done.set_running_or_notify_cancel()
            try:
                result = change()
            except BaseException as exc:
                if not wanted:
                    raise
                done.set_exception(exc)
                return
            if wanted:
                done.set_result(result)

        self(run)
        return done


class ControlThread:
    """An event loop on a thread of its own, for the control plane."""

    def __init__(self, name: str = "letsinfer-control") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        # The loop holds its tasks only weakly: one waiting on something no
        # timer or socket holds (an Event) would be collected mid-wait, its
        # ``finally`` run by the garbage collector on whatever thread.
        self._tasks: set[asyncio.Task[Any]] = set()

    def _main(self) -> None:
        loop = _new_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def start(self, setup: Callable[[], Awaitable[Any]]) -> None:
        """Start the thread and run ``setup`` there (start the planes...)."""
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        await asyncio.to_thread(self._ready.wait)
        await self.run(setup)

    async def run(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run a coroutine on the control loop; wait for it without blocking ours."""
        assert self.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work(), self.loop))

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run ``fn(*args)`` on the control loop, from any thread; False when
        the loop is not running (before start, after stop)."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return False
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # closed meanwhile
            return False
        return True

    def spawn(self, work: Callable[[], Awaitable[Any]]) -> None:
        """Start a task on the control loop (from that loop's own thread)."""
        assert self.loop is not None
        task = self.loop.create_task(work())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_report_end)

    async def stop(self, teardown: Callable[[], Awaitable[Any]], join_s: float = 30) -> bool:
        """Run ``teardown`` there, then stop the loop and the thread; True once
        the thread has ended (what it used may be closed), False when it is
        still busy after ``join_s``."""
        if self.loop is None or self._thread is None:
            return True
        try:
            await self.run(teardown)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self._thread.join, join_s)
        return not self._thread.is_alive()


def _report_end(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a control plane task ended", exc_info=task.exception())
