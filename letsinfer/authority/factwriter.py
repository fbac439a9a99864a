"""Nodes' facts and observations, written in batches: one transaction per
short interval for every node that reported meanwhile (group commit), not one
commit and fsync per report.

What is batched is only what the nodes report: their facts (with the facts'
sequence, the witnessed audit head, the certificate they presented), what
their engines are doing, and that a node was heard while the main shed its
report. Enrollments, keys, removals and every audit record are written at once
in their own transactions, as before.

A report is answered only once its batch committed. So every facts envelope
the main answered is on disk with its sequence number, and a replay of it is
refused after a restart, a kill included. A batch lost to a kill held only
envelopes that were never answered; such an envelope counts as never
received (its signed timestamp still bounds how late it may arrive: 30 s).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from letsinfer.store import AuthorityStore, FactsUpdate

log = logging.getLogger("letsinfer.control")

Write = Callable[[AuthorityStore], None]


class NotRecorded(Exception):
    """The batch holding a report could not be committed (the report is refused
    with 503: the node sends newer facts soon)."""


class FactWriter:
    """Event-loop thread only (the control plane's); ``flush`` runs the one
    transaction without yielding, so nothing else on that connection interleaves."""

    def __init__(
        self,
        store: AuthorityStore,
        interval_s: float,
        clock: Callable[[], float] = time.time,
        cost_s: float = 0.0,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.clock = clock
        # A test seam: extra seconds each facts row costs, inside the batch's
        # transaction (a slow disk, an overloaded main).
        self.cost_s = cost_s
        self._facts: dict[str, FactsUpdate] = {}
        self._heard: dict[str, float] = {}
        self._writes: list[Write] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self.batches = 0  # committed
        self.rows = 0  # facts rows committed

    @property
    def backlog(self) -> int:
        """Reports waiting for their batch."""
        return len(self._waiting)

    def facts(self, update: FactsUpdate) -> asyncio.Future[None]:
        """Stage a node's accepted facts; the future resolves when they are on
        disk (or fails with NotRecorded). Newer facts of the same node replace
        older ones still waiting."""
        self.stage(update)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(done)
        return done

    def stage(self, update: FactsUpdate) -> None:
        """Stage facts nobody waits for (the main's own)."""
        old = self._facts.get(update.node_id)
        if old is not None and old.seq > update.seq:
            update = old
        self._facts[update.node_id] = update
        self._schedule()

    def heard(self, node_id: str) -> None:
        """The node reported (the main shed it): it is alive."""
        self._heard[node_id] = self.clock()
        self._schedule()

    def write(self, change: Write) -> None:
        """An observation (an engine's state) for the next batch, in order."""
        self._writes.append(change)
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval_s, self.flush)

    def flush(self) -> None:
        """Write everything staged in one transaction, then answer its reports."""
        self._timer = None
        facts, heard, writes, waiting = self._facts, self._heard, self._writes, self._waiting
        self._facts, self._heard, self._writes, self._waiting = {}, {}, [], []
        if not (facts or heard or writes):
            return
        error: Exception | None = None
        try:
            with self.store.transaction():
                updates = list(facts.values())
                self.store.record_facts_batch(updates, heard)
                for change in writes:
                    change(self.store)
                if self.cost_s:
                    time.sleep(self.cost_s * len(updates))
        except Exception as exc:  # answered 503; the nodes report again soon
            log.error("could not write a batch of %d node report(s): %s", len(facts), exc)
            error = exc
        else:
            self.batches += 1
            self.rows += len(facts)
        for done in waiting:
            if done.done():
                continue
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(NotRecorded(str(error)))
