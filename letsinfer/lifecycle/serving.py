"""What lifecycle operations need from the running main: its authority, its
routing table (to drain groups), a way to apply desired state at once, and
the group states its agents report.

Operations run inside the main node's process, so draining sees the gateway's
own count of requests in flight and a change reaches the main's engines
before the next reconcile. Group states come from the authority, where the
main records every observation (its own engines at once, children's from
their signed facts), each tagged with the generation it belongs to.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from letsinfer.config import LifecycleSettings
from letsinfer.gateway.routing import RoutingTable
from letsinfer.release.keys import PublicKey
from letsinfer.store import AuthorityStore, PlacementGroupRecord

# A group's start ended: it serves, or it will not without an administrator.
SETTLED = ("ready", "parked", "failed")


class Busy(Exception):
    """Another lifecycle operation is under way on this main."""


@dataclass(frozen=True)
class Started:
    """How a group's (re)start ended."""

    state: str  # ready, parked, failed, timeout, gone
    detail: str | None = None

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def why(self) -> str:
        return f"{self.state}: {self.detail}" if self.detail else self.state


def _fits(pg: PlacementGroupRecord, gpus: tuple[str, ...]) -> str | None:
    return None  # nothing says a second engine would not fit


@dataclass
class Serving:
    store: AuthorityStore
    routing: RoutingTable
    apply: Callable[[], None]  # desired state and the gateway's view, applied now
    settings: LifecycleSettings
    trusted: list[PublicKey] = field(default_factory=list)  # release signers
    stale_after_s: float = 20.0  # a child without facts this long is unreachable
    # That silence on the wall clock, widened by the time the main was too busy
    # to hear its nodes (letsinfer.authority.overload.AttentionClock.window).
    window: Callable[[float], float] = lambda quiet_s: quiet_s
    # Why a second engine of a group would not fit on these GPUs of its node
    # (none: in its RAM), or None (restarts.memory_check on a main).
    fit_beside: Callable[[PlacementGroupRecord, tuple[str, ...]], str | None] = _fits
    poll_s: float = 0.25
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _doing: str | None = None

    @contextlib.asynccontextmanager
    async def exclusive(self, what: str) -> AsyncIterator[None]:
        """One lifecycle operation at a time on this main."""
        if self._lock.locked():
            raise Busy(f"another lifecycle operation is under way ({self._doing}); try again")
        async with self._lock:
            self._doing = what
            try:
                yield
            finally:
                self._doing = None

    @property
    def shown_stale_after_s(self) -> float:
        """How long a child may go unheard (wall clock) before it is unreachable."""
        return self.window(self.stale_after_s)

    def unreachable(self, node_id: str) -> str | None:
        """Why a group on this node cannot be changed now (None: it can)."""
        node = self.store.get_node(node_id)
        if node is None:
            return "its node is gone"
        if node.role == "main":
            return None
        # Heard: its facts, or a report the main shed while busy (it is alive).
        heard = max(node.facts_at or 0.0, node.last_seen or 0.0)
        if node.facts_at is None or time.time() - heard > self.shown_stale_after_s:
            return f"its node {node.name} is unreachable (no fresh facts from its agent)"
        return None

    async def drain(self, pg_ids: set[str]) -> int:
        """Admit nothing new to these groups and wait (bounded) for their
        requests in flight to finish; returns how many were still running
        when the wait ended (0: drained). The caller undrains."""
        self.routing.drain(pg_ids)
        deadline = time.monotonic() + self.settings.drain_timeout_s
        while self.routing.in_flight(pg_ids) and time.monotonic() < deadline:
            await asyncio.sleep(self.poll_s)
        return self.routing.in_flight(pg_ids)

    async def started(self, pg_id: str) -> Started:
        """Wait until the group's current generation is ready (healthy and
        proven by its agent), parked or refused, or the start timeout passes."""
        deadline = time.monotonic() + self.settings.start_timeout_s
        while True:
            pg = self.store.get_placement_group(pg_id)
            if pg is None:
                return Started("gone", "the placement group was removed meanwhile")
            current = (pg.observed_generation or 0) == pg.generation
            if current and pg.state in SETTLED:
                return Started(pg.state, pg.detail if pg.state != "ready" else None)
            if time.monotonic() > deadline:
                return Started(
                    "timeout",
                    f"not ready after {self.settings.start_timeout_s:.0f}s "
                    f"(last seen: {pg.state}{f', {pg.detail}' if pg.detail else ''})",
                )
            await asyncio.sleep(self.poll_s)

    async def stopped(self, pg_ids: set[str], timeout_s: float) -> set[str]:
        """Wait (bounded) until no engine of these groups runs; returns those
        still reported running."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = {
                pg.id
                for pg_id in pg_ids
                if (pg := self.store.get_placement_group(pg_id)) is not None
                and pg.state != "stopped"
            }
            if not left or time.monotonic() > deadline:
                return left
            await asyncio.sleep(self.poll_s)
