"""When the main cannot keep up with its nodes' reports: shed some with 503
and ``Retry-After`` instead of letting them time out, and stop the clock
that ages nodes while it does.

The control plane's event loop measures its own lag, how late a short timer
fires: a loop that wakes late has more work than time. Above ``high_s`` the
share of reports it sheds grows; below ``low_s`` it falls again, so the main
settles at what it can take. A shed report costs a parsed request and a short
answer, not a verified, recorded one; the agent comes back after
``Retry-After`` (with jitter, see letsinfer/agent/pacing.py).

While the main sheds, and for one ``Retry-After`` and an interval past it (so
that every node told to wait has had its turn), its :class:`AttentionClock`
stands still. Every staleness judgement of the main's (routing's facts age,
nodes gone quiet, links) is made on that clock, so a node is never called
unreachable because the main was too busy to hear it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from letsinfer.connections import Tally

log = logging.getLogger("letsinfer.control")

_HOLDS_KEPT = 32  # past holds remembered, for AttentionClock.window


class AttentionClock:
    """Monotonic seconds, less the time the main was not listening. Read from
    any thread (its state is one tuple, swapped whole); held by the control
    thread's :class:`Shedder`."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._mono = monotonic
        # seconds lost before the current hold, when that hold began, when it
        # ends, and the last few holds over (since, until), for `window`
        self._state: tuple[float, float | None, float, tuple[tuple[float, float], ...]] = (
            0.0,
            None,
            0.0,
            (),
        )

    def now(self) -> float:
        lost, since, until, _ = self._state
        m = self._mono()
        if since is not None:
            lost += max(0.0, min(m, until) - since)
        return m - lost

    def hold(self, until: float) -> None:
        """Stand still from now (or since the hold under way began) until
        ``until`` (monotonic), or later if a hold already reaches further."""
        m = self._mono()
        lost, since, end, past = self._state
        if since is not None and end <= m:  # the last hold is over: count it
            lost += max(0.0, end - since)
            past = (*past[-(_HOLDS_KEPT - 1) :], (since, end))
            since = None
        if since is None:
            since, end = m, until
        self._state = (lost, since, max(end, until), past)

    def window(self, quiet_s: float) -> float:
        """The wall-clock silence that is ``quiet_s`` on this clock now: how
        long a node may have gone unheard before it counts as gone, the main's
        own deafness left out (what displays reading the authority use)."""
        _, since, until, past = self._state
        m = self._mono()
        holds = (*past, (since, until)) if since is not None else past
        remaining, t = quiet_s, m  # walking back from now, over the holds
        for begin, end in sorted(((b, min(e, m)) for b, e in holds), reverse=True):
            running = max(0.0, t - end)  # the clock ran between this hold and t
            if running >= remaining:
                break
            remaining -= running
            t = min(t, begin)
        return (m - t) + remaining

    @property
    def held(self) -> bool:
        _, since, until, _ = self._state
        return since is not None and self._mono() < until


@dataclass
class Shedder:
    """Decides, per report, whether the control plane takes it now."""

    clock: AttentionClock
    retry_after_s: int  # what a shed report is told
    interval_s: float  # the nodes' heartbeat
    high_s: float = 0.25  # loop lag above which the share shed grows
    low_s: float = 0.05  # and below which it falls
    tick_s: float = 0.1
    max_backlog: int = 2000  # reports waiting for their batch's commit
    rng: Callable[[], float] = random.random
    mono: Callable[[], float] = time.monotonic
    share: float = 0.0  # of reports shed now
    lag_s: float = 0.0  # the loop's latest lag
    reports: int = 0  # reports that reached the decision
    shed: int = 0  # of them, answered 503
    _since: float | None = None  # when this shedding spell began
    _spell_shed: int = 0
    _tally: Tally | None = field(default=None, repr=False)

    def admit(self, backlog: int = 0) -> int | None:
        """None: take this report. Otherwise the seconds of ``Retry-After``
        to answer it with (503)."""
        self.reports += 1
        if backlog > self.max_backlog and self.share < 1.0:
            self._shift(min(1.0, self.share + 0.1), f"{backlog} reports wait for the disk")
        if self.share <= 0.0 or self.rng() >= self.share:
            return None
        self.shed += 1
        self._spell_shed += 1
        if self._tally is not None:
            self._tally.note(f"{self.share:.0%} of reports shed, loop {self.lag_s:.2f}s late")
        return self.retry_after_s

    def observe(self, lag_s: float) -> None:
        """One measurement of the loop's lag (seconds a timer fired late)."""
        self.lag_s = lag_s
        if lag_s > self.high_s:
            # The further behind, the faster the share grows.
            self._shift(min(1.0, self.share + 0.05 + lag_s / 4), f"loop {lag_s:.2f}s late")
        elif lag_s < self.low_s and self.share > 0.0:
            self._shift(max(0.0, self.share - 0.02), "")
        if self.share > 0.0:
            # Nodes told to come back later, and those it could not hear, do
            # not age meanwhile (nor for the wait it asked of them).
            self.clock.hold(self.mono() + self.retry_after_s * 1.5 + self.interval_s)

    def _shift(self, share: float, why: str) -> None:
        was = self.share
        self.share = share
        if was <= 0.0 < share:
            self._since = self.mono()
            self._spell_shed = 0
            log.warning(
                "control plane: falling behind (%s): answering a share of reports with "
                "503 and Retry-After %ds until it catches up; nodes do not go stale meanwhile",
                why,
                self.retry_after_s,
            )
        elif share <= 0.0 < was:
            took = self.mono() - (self._since or self.mono())
            log.warning(
                "control plane: caught up; stopped shedding after %.0fs "
                "(%d report(s) answered 503)",
                took,
                self._spell_shed,
            )
            self._since = None

    @property
    def shedding(self) -> bool:
        return self.share > 0.0

    async def watch(self) -> None:
        """Measure the running loop's lag every tick, for as long as it runs."""
        self._tally = Tally("control plane: shed %d report(s) with 503 in the last minute (%s)")
        try:
            while True:
                start = self.mono()
                await asyncio.sleep(self.tick_s)
                self.observe(max(0.0, self.mono() - start - self.tick_s))
        finally:
            self._tally.close()
