"""An engine process as the supervisor sees it: one it started, or one it adopted.

A process this agent started is its child (asyncio reaps it and knows its exit
status). A process adopted after a restart is not: it is watched and signalled
through a pidfd, which always names that exact process even if its pid is
reused later, so a signal can never reach another program.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Protocol


class EngineProcess(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def running(self) -> bool: ...

    async def wait(self) -> int | None:
        """Until it exits; its exit status when known (a child's), else None."""
        ...

    def send(self, sig: signal.Signals) -> None: ...

    def close(self) -> None: ...


class SpawnedProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc.returncode is None

    async def wait(self) -> int | None:
        return await self._proc.wait()

    def send(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(sig)

    def close(self) -> None:
        return None


class AdoptedProcess:
    """A running engine proven to be this node's own (see agent/reattach.py)."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self._pid = pid
        self._pidfd: int | None = pidfd
        self._exited = asyncio.Event()
        self._watching = False

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def running(self) -> bool:
        return not self._exited.is_set()

    async def wait(self) -> int | None:
        if self._pidfd is not None and not self._watching and not self._exited.is_set():
            # A pidfd turns readable when its process exits: one reader for every waiter.
            fd = self._pidfd
            loop = asyncio.get_running_loop()

            def exited() -> None:
                loop.remove_reader(fd)
                self._exited.set()

            loop.add_reader(fd, exited)
            self._watching = True
        await self._exited.wait()
        return None

    def send(self, sig: signal.Signals) -> None:
        if self._pidfd is not None and not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def close(self) -> None:
        if self._pidfd is not None:
            if self._watching and not self._exited.is_set():
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
