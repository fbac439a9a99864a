"""Request records off the request path.

The gateway hands each finished request's record to :meth:`RequestLog.add`,
which only appends it to a list in memory. A background task takes the list
every ``flush_interval_s`` and writes it in one transaction from a thread of
its own, into the records' own database (letsinfer.store.requests), so the
event loop never waits on a disk and the authority's database never waits on
these writes. Records older than ``keep_days`` are deleted hourly.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from letsinfer.config import RequestSettings
from letsinfer.store.requests import KeyUsage, RequestRecord, RequestStore

log = logging.getLogger("letsinfer.usage")

_PRUNE_EVERY_S = 3600.0


class RequestLog:
    def __init__(
        self,
        path: Path,
        settings: RequestSettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        s = settings or RequestSettings()
        self.path = path
        self.keep_s = s.keep_days * 86400.0
        self.flush_interval_s = s.flush_interval_s
        self.max_pending = s.max_pending
        self.clock = clock
        self.dropped = 0  # records given up because the writer fell behind
        self._pending: list[RequestRecord] = []
        # What the file could not take (a full disk), oldest first: owned by
        # the writer thread, which writes it before anything newer.
        self._unwritten: list[RequestRecord] = []
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="request-records")
        self._store: RequestStore | None = None  # opened and used in the writer thread
        self._pruned_at = 0.0
        self._index_tried = -_PRUNE_EVERY_S  # (monotonic) the end-time index's last try
        self._complained_at = 0.0

    def add(self, record: RequestRecord) -> None:
        """On the request path: an append, nothing else."""
        self.add_many((record,))

    def add_many(self, records: Iterable[RequestRecord]) -> None:
        remaining = iter(records)
        room = self.max_pending - self.backlog
        self._pending.extend(itertools.islice(remaining, max(room, 0)))
        self.dropped += sum(1 for _ in remaining)  # what did not fit

    @property
    def backlog(self) -> int:
        """Records not written yet."""
        return len(self._pending) + len(self._unwritten)

    async def run(self) -> None:
        """Write every interval; when cancelled, write what is left and close."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(self.flush_interval_s)
                await self.flush()
        finally:
            batch, self._pending = self._pending, []
            with contextlib.suppress(Exception):
                await loop.run_in_executor(self._executor, self._write_and_close, batch)
            self._executor.shutdown(wait=False)

    async def flush(self) -> None:
        batch, self._pending = self._pending, []
        store = self._store
        if batch or store is None or self._unwritten or not store.dated_at_end:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, self._write_then_index, batch
            )

    def usage_of(
        self, period_starts: dict[str, float | None], window_from: float
    ) -> Awaitable[dict[str, KeyUsage]]:
        """What the records say these keys used (letsinfer.gateway.limits rebuilds
        its counts from it). The records not written yet are written first, in
        the same step: at the moment of this call, every finished request is
        either in what this reads or counted in memory after it."""
        batch, self._pending = self._pending, []
        return self._usage(batch, period_starts, window_from)

    async def _usage(
        self,
        batch: list[RequestRecord],
        period_starts: dict[str, float | None],
        window_from: float,
    ) -> dict[str, KeyUsage]:
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._write_then_read, batch, period_starts, window_from
        )

    # -- in the writer thread ------------------------------------------------
    def _write_then_read(
        self,
        batch: list[RequestRecord],
        period_starts: dict[str, float | None],
        window_from: float,
    ) -> dict[str, KeyUsage]:
        self._write(batch)
        store = self._store or RequestStore(self.path)
        self._store = store
        usage = store.key_usage(period_starts, window_from)
        if self._unwritten:  # waiting for the disk, but counted now
            waiting = RequestStore.unwritten(self._unwritten)
            try:
                more = waiting.key_usage(period_starts, window_from)
            finally:
                waiting.close()
            for key, (spent, recent) in more.items():
                had, seen = usage.get(key, (0, []))
                usage[key] = (had + spent, sorted([*seen, *recent]))
        return usage

    def _write(self, batch: list[RequestRecord]) -> None:
        """In the writer thread: what waited for the disk, then ``batch``."""
        batch = self._unwritten + batch if self._unwritten else batch
        try:
            if self._store is None:
                self._store = RequestStore(self.path)
            if batch:
                self._store.insert_many(batch)
        except Exception as exc:  # a full or broken disk: say so, keep serving
            self._complain(exc)
            # Kept for the next round (the oldest first), within the bound.
            room = max(0, self.max_pending - len(self._pending))
            self._unwritten = batch[:room]
            self.dropped += len(batch) - len(self._unwritten)
            return
        self._unwritten = []
        now = self.clock()
        if now - self._pruned_at >= _PRUNE_EVERY_S:
            self._pruned_at = now
            try:  # (written already: a failed delete loses nothing, nor counts twice)
                gone = self._store.prune(now - self.keep_s)
            except Exception as exc:
                self._complain(exc)
            else:
                if gone:
                    log.info("deleted %d request record(s) older than the kept days", gone)

    def _write_then_index(self, batch: list[RequestRecord]) -> None:
        """A round of the writer: ``batch``, then, once, the end-time index a
        file of an earlier release lacks (records wait in memory meanwhile;
        the loop serves on)."""
        self._write(batch)
        store = self._store
        began = time.monotonic()
        if store is None or store.dated_at_end or began - self._index_tried < _PRUNE_EVERY_S:
            return
        self._index_tried = began
        try:
            store.date_at_end()
        except Exception as exc:  # a full disk: tried again within the hour
            self._complain(exc)
        else:
            log.info(
                "request records indexed by end time in %.1fs (once, after an upgrade)",
                time.monotonic() - began,
            )

    def _complain(self, exc: Exception) -> None:
        if time.monotonic() - self._complained_at > 60:
            self._complained_at = time.monotonic()
            log.error("cannot write request records to %s: %s", self.path, exc)

    def _write_and_close(self, batch: list[RequestRecord]) -> None:
        self._write(batch)
        if self.dropped:
            log.warning("%d request record(s) were dropped: the writer fell behind", self.dropped)
        if self._store is not None:
            self._store.close()
            self._store = None
