"""A thread that keeps the GIL busy, as the gateway's event loop does under load.

Used by the benchmarks of work another thread does beside that loop (the
request records' writer, the facts batch): sqlite3 lets go of the GIL around
each statement it steps and must win it back from this thread.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType


class BusyThread:
    """``with BusyThread() as busy:`` spins in Python until the block ends;
    ``busy.pace`` is then its laps a second (how much the block slowed it)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self.laps = 0
        self.pace = 0.0
        self._started = 0.0

    def _spin(self) -> None:
        while not self._stop.is_set():
            for _ in range(1000):
                pass
            self.laps += 1

    def __enter__(self) -> BusyThread:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.pace = self.laps / (time.perf_counter() - self._started)
