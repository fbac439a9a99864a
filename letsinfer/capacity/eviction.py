"""Which resident group may go to make room for a load, and whether a swap
is worth it now: pure choices.

Only groups of on-demand models are candidates, and of those only the ones
with no request in flight, nothing waiting for their model, and resident
longer than their model's minimum residence. Among them the cheapest to
have to load again goes first: the measured load time, weighted by how much
the model was used lately (a model used often would come straight back).

A swap is not made just because a group is evictable: the requests of the
models resident are served first while the model waiting is used less than
the one that would go (a swap then costs two loads soon, and the busier
model's requests would wait for the second). The wait this imposes is
bounded: once a waiting request has deferred ``defer_s`` the swap is made,
and if every candidate is busy the cheapest one past its residence is
drained (admits nothing new, finishes what it runs) and goes then.

Neither is done to a group while a cheaper one, still inside its minimum
residence (often still loading), will be past it before the waiting request
runs out of patience (its queue timeout): the load waits for that one.
Otherwise the most used model, often the only group past its residence,
would go each time a rare model's load had just taken the other GPU, and
its own requests would wait for it to load again.

Nor is an idle group evicted while a cheaper one past its residence is only
busy this instant, as long as the waiting requests have time: the cheaper
one goes once idle, or, with nothing queued for its model, is drained once
the wait is due and goes when its requests finish. Otherwise requests that
take GPU time (seconds each) left the most used model the only idle group
as often as not, and it went for a rare one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_RELOAD_S = 5.0  # a model never loaded here yet


@dataclass(frozen=True)
class Resident:
    pg_id: str
    service: str
    node_id: str
    on_demand: bool
    in_flight: int
    waiting: int  # requests queued for its model
    resident_s: float
    min_resident_s: float
    reload_s: float | None  # its model's last measured load time
    recent_requests: float  # its model's requests lately (decayed)
    idle_s: float = 0.0  # since its model's last request
    draining: bool = False  # drained to make room: it goes once its requests finish

    @property
    def past_residence(self) -> bool:
        return self.on_demand and self.resident_s >= self.min_resident_s

    @property
    def evictable(self) -> bool:
        if self.draining:  # (its model's waiters wait for a load of their own)
            return self.in_flight == 0
        return self.past_residence and self.in_flight == 0 and self.waiting == 0

    @property
    def cost(self) -> float:
        return (self.reload_s or DEFAULT_RELOAD_S) * (1.0 + self.recent_requests)

    @property
    def frees_later(self) -> bool:
        """Not evictable now, but it will be once idle or old enough."""
        return self.on_demand and not self.evictable


@dataclass(frozen=True)
class Waiting:
    """The model a load is for: what asks for it."""

    service: str
    waiting: int  # requests queued for it now
    recent_requests: float  # its requests lately (decayed), as Resident's
    waited_s: float  # since its load began (its oldest request's arrival)
    # How much longer its requests can wait and still be served in time (their
    # queue timeout, less what they waited and a load's time).
    patience_s: float = math.inf


def _cheapest(candidates: Sequence[Resident]) -> Resident:
    """The one to go first: the lowest cost, then the longest resident."""
    return min(candidates, key=lambda r: (r.cost, -r.resident_s, r.pg_id))


def choose(residents: list[Resident], exclude_service: str, rule: str = "cost") -> Resident | None:
    """The cheapest evictable group not of ``exclude_service`` (the model
    loading); with ``rule`` "lru", the one whose model was used least recently."""
    candidates = [r for r in residents if r.evictable and r.service != exclude_service]
    if not candidates:
        return None
    if rule == "lru":
        return max(candidates, key=lambda r: (r.idle_s, r.pg_id))
    return _cheapest(candidates)


def cheaper_soon(residents: Sequence[Resident], than: Resident, loading: Waiting) -> bool:
    """Whether a group cheaper than ``than``, only too young to go (loading,
    or serving what waited for its load), will be past its residence within
    ``loading``'s patience: it can go then (idle, or drained)."""
    return any(
        r.on_demand
        and not r.draining
        and not r.past_residence
        and r.service != loading.service
        and r.cost < than.cost
        and r.min_resident_s - r.resident_s <= loading.patience_s
        for r in residents
    )


def _busy_past_residence(residents: Sequence[Resident], loading: Waiting) -> list[Resident]:
    """Groups (not ``loading``'s) past their residence that could go but for
    their requests: in flight or queued, or still draining."""
    return [
        r
        for r in residents
        if r.past_residence and not r.evictable and r.service != loading.service
    ]


def cheaper_busy(residents: Sequence[Resident], than: Resident, loading: Waiting) -> bool:
    """Whether a group cheaper than ``than``, past its residence, is only busy
    this instant while ``loading``'s requests can still wait: it goes once
    idle, or drained. (One drained already for this load counts until it goes:
    otherwise the idle group went too, the instant after the drain began.)"""
    return loading.patience_s > 0 and any(
        r.cost < than.cost for r in _busy_past_residence(residents, loading)
    )


def worth_swapping(
    victim: Resident, loading: Waiting, defer_s: float, residents: Sequence[Resident] = ()
) -> bool:
    """Whether ``victim`` should go for ``loading`` now: no cheaper group is
    about to be free or only busy (``residents``; to_drain takes that one),
    and the waiting model is asked for at least as much as the victim's (its
    queued requests and its recent ones against the victim's recent ones), or
    its oldest request has deferred ``defer_s`` already."""
    if victim.draining:
        return True
    if cheaper_soon(residents, victim, loading) or cheaper_busy(residents, victim, loading):
        return False
    if loading.waited_s >= defer_s:
        return True
    return loading.waiting + loading.recent_requests >= victim.recent_requests


def to_drain(
    residents: list[Resident], loading: Waiting, defer_s: float, idle: Resident | None = None
) -> Resident | None:
    """A busy group to drain for ``loading`` once its wait reached ``defer_s``:
    the cheapest past its residence (never pinned, never the loading model's,
    never one drained already) unless a cheaper one is about to be free; None
    otherwise. With ``idle`` (the group that could go now), only one cheaper
    than it with nothing queued for its model."""
    if loading.waited_s < defer_s:
        return None
    if any(r.draining and r.service != loading.service for r in residents):
        return None  # one makes room already
    candidates = [
        r
        for r in _busy_past_residence(residents, loading)
        if idle is None or (r.cost < idle.cost and r.waiting == 0)
    ]
    if not candidates:
        return None
    cheapest = _cheapest(candidates)
    return None if cheaper_soon(residents, cheapest, loading) else cheapest


def may_free_later(residents: list[Resident], exclude_service: str) -> bool:
    """Whether waiting could help: an on-demand group (of another model) that is
    busy or too young now can be evicted later. Pinned groups never free."""
    return any(r.frees_later and r.service != exclude_service for r in residents)
