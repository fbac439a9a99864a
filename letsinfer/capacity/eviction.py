"""Which resident group may go to make room for a load: a pure choice.

Only groups of on-demand models are candidates, and of those only the ones
with no request in flight, nothing waiting for their model, and resident
longer than their model's minimum residence. Among them the cheapest to
have to load again goes first: the measured load time, weighted by how much
the model was used lately (a model used often would come straight back).
"""

from __future__ import annotations

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

    @property
    def evictable(self) -> bool:
        return (
            self.on_demand
            and self.in_flight == 0
            and self.waiting == 0
            and self.resident_s >= self.min_resident_s
        )

    @property
    def cost(self) -> float:
        return (self.reload_s or DEFAULT_RELOAD_S) * (1.0 + self.recent_requests)

    @property
    def frees_later(self) -> bool:
        """Not evictable now, but it will be once idle or old enough."""
        return self.on_demand and not self.evictable


def choose(residents: list[Resident], exclude_service: str, rule: str = "cost") -> Resident | None:
    """The cheapest evictable group not of ``exclude_service`` (the model
    loading); with ``rule`` "lru", the one whose model was used least recently."""
    candidates = [r for r in residents if r.evictable and r.service != exclude_service]
    if not candidates:
        return None
    if rule == "lru":
        return max(candidates, key=lambda r: (r.idle_s, r.pg_id))
    return min(candidates, key=lambda r: (r.cost, -r.resident_s, r.pg_id))


def may_free_later(residents: list[Resident], exclude_service: str) -> bool:
    """Whether waiting could help: an on-demand group (of another model) that is
    busy or too young now can be evicted later. Pinned groups never free."""
    return any(r.frees_later and r.service != exclude_service for r in residents)
