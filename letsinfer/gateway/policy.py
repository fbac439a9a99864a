"""Replica choice: a small function of plain data, so it is testable alone.

1. Only replicas that are not paused, whose facts (when they report any) are
   fresh, and that have a free slot by the gateway's own count are
   candidates: an engine never gets more requests than its capacity.
2. A request whose prompt starts with at least ``affinity_min_chars``
   characters carries an affinity hash of that leading part. Affinity only
   chooses among the candidates the facts allow: a replica whose fresh facts
   say its GPU is hot, its engine has no free slot or requests queued is left
   out while another candidate is clear of all three. Those are ranked by
   rendezvous hashing (highest random weight) on that hash, so the same
   prefix keeps going to the same replica, whose prompt cache already holds
   it, and only 1/n of prefixes move when a replica comes or goes. The first
   ranked replica whose load stays within ``load_bound`` times its fair share
   takes it (consistent hashing with bounded loads), so one hot prefix cannot
   pin all traffic to one replica.
3. Otherwise (no hint, or every ranked replica above its bound) the least
   loaded candidate wins: load is the share of its slots in use, plus the
   engine's own queue and a penalty for a hot GPU when fresh facts say so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

from letsinfer.gateway.routing import Replica

# A GPU this hot is likely throttling: prefer a cooler replica.
_HOT_C = 80.0
_HOT_PENALTY_PER_C = 0.05  # in units of "share of slots busy"


@dataclass(frozen=True)
class RoutingPolicy:
    affinity_prefix_chars: int = 256  # how much of the prompt's start is hashed; 0: off
    affinity_min_chars: int = 32  # shorter prompts carry no hint
    load_bound: float = 1.25  # a replica may hold at most this times its fair share
    fact_max_age_s: float = 10.0  # older facts make a replica stale: never chosen

    @property
    def affinity(self) -> bool:
        return self.affinity_prefix_chars > 0


def usable(replica: Replica, now: float, policy: RoutingPolicy) -> bool:
    """Routable at all: not paused, and its facts (if it reports any) fresh."""
    if replica.paused:
        return False
    return replica.facts_at is None or now - replica.facts_at <= policy.fact_max_age_s


def held_back(replica: Replica) -> bool:
    """Whether a usable replica's facts advise against it: its GPU is hot, or
    its engine has no free slot or requests waiting. (Called on candidates
    only, whose facts, when they report any, are fresh.)"""
    if replica.facts_at is None:
        return False
    temperature = replica.temperature_c
    return (
        replica.slots_free == 0
        or bool(replica.queue_depth)
        or (temperature is not None and temperature > _HOT_C)
    )


def load(replica: Replica, now: float, policy: RoutingPolicy) -> float:
    """How busy a replica is, in units of its capacity (0 idle, 1 full)."""
    cap = max(replica.capacity, 1)
    busy = replica.in_flight / cap
    if replica.facts_at is not None and now - replica.facts_at <= policy.fact_max_age_s:
        if replica.slots_free is not None:
            busy = max(busy, 1.0 - replica.slots_free / cap)
        if replica.queue_depth:
            busy += replica.queue_depth / cap
        if replica.temperature_c is not None and replica.temperature_c > _HOT_C:
            busy += (replica.temperature_c - _HOT_C) * _HOT_PENALTY_PER_C
    return busy


_MASK64 = (1 << 64) - 1


def _rendezvous_weight(prefix_hash: int, replica: Replica) -> int:
    # splitmix64's finaliser: Python's tuple hash mixes too weakly for the
    # ranking to be uniform across replicas.
    x = (prefix_hash ^ hash(replica.pg_id)) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def choose(
    replicas: Iterable[Replica],
    now: float,
    policy: RoutingPolicy,
    prefix_hash: int | None = None,
    exclude: frozenset[str] = frozenset(),
) -> Replica | None:
    """The replica to send a request to, or None when every usable one is full."""
    # (Every request passes here: one plain loop, no sorting on the way.)
    candidates = []
    total = 1  # requests in flight at the candidates, counting this one
    capacity = 0
    for r in replicas:
        if not r.full and r.pg_id not in exclude and usable(r, now, policy):
            candidates.append(r)
            total += r.in_flight
            capacity += max(r.capacity, 1)
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    if prefix_hash is not None:
        # Affinity never overrides the facts: a hot, full or queued replica is
        # left out while another is clear (all held back: all stay in).
        clear = [r for r in candidates if not held_back(r)]
        if clear and len(clear) < len(candidates):
            if len(clear) == 1:
                return clear[0]
            candidates, total, capacity = clear, 1, 0
            for r in clear:
                total += r.in_flight
                capacity += max(r.capacity, 1)
        # The prefix's own replica first, then the next by weight, the first
        # under its bound (with a bound of at least 1 there is always one).
        # (A sort of a few, keyed in C, costs less than a max and a closure.)
        ranked = sorted(candidates, key=partial(_rendezvous_weight, prefix_hash), reverse=True)
        bound = policy.load_bound
        for r in ranked:
            fair_share = total * max(r.capacity, 1) / capacity
            if r.in_flight + 1 <= math.ceil(bound * fair_share):
                return r
    return min(candidates, key=lambda r: (load(r, now, policy), r.in_flight))


def prefix_hash(text: str, policy: RoutingPolicy) -> int | None:
    """The affinity hint for a prompt: a hash of its first characters, or None
    when it is shorter than the minimum match."""
    if not policy.affinity or len(text) < policy.affinity_min_chars:
        return None
    return hash(text[: policy.affinity_prefix_chars])
