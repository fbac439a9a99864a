"""Which replica (placement group) serves a request.

Kept as plain data and small functions so the policy is testable without a
server. Replicas appear when their engine reports ready and disappear the
moment it stops being ready.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Replica:
    pg_id: str
    service: str
    base_url: str
    authorization: str  # "Bearer <per-replica engine key>"
    capacity: int
    node_id: str = ""
    paused: bool = False
    in_flight: int = 0

    @property
    def pressure(self) -> float:
        return self.in_flight / max(self.capacity, 1)


@dataclass
class RoutingTable:
    _by_service: dict[str, dict[str, Replica]] = field(default_factory=dict)
    # Groups that exist but are not ready, with why: explains a 503.
    _not_ready: dict[str, dict[str, str]] = field(default_factory=dict)
    # Paused nodes admit nothing new; their in-flight requests finish.
    _paused_nodes: frozenset[str] = frozenset()

    def set_paused_nodes(self, nodes: set[str]) -> None:
        self._paused_nodes = frozenset(nodes)

    def _admits(self, r: Replica) -> bool:
        return not r.paused and r.node_id not in self._paused_nodes

    def publish(self, replica: Replica) -> None:
        self._not_ready.get(replica.service, {}).pop(replica.pg_id, None)
        current = self._by_service.setdefault(replica.service, {}).get(replica.pg_id)
        if current is not None:
            replica.in_flight = current.in_flight
        self._by_service[replica.service][replica.pg_id] = replica

    def withdraw(self, service: str, pg_id: str, reason: str) -> None:
        self._by_service.get(service, {}).pop(pg_id, None)
        self._not_ready.setdefault(service, {})[pg_id] = reason

    def forget(self, service: str, pg_id: str) -> None:
        self._by_service.get(service, {}).pop(pg_id, None)
        self._not_ready.get(service, {}).pop(pg_id, None)

    def replicas(self, service: str) -> list[Replica]:
        return list(self._by_service.get(service, {}).values())

    def ready_count(self, service: str) -> int:
        return sum(1 for r in self.replicas(service) if self._admits(r))

    def explain(self, service: str) -> str:
        waiting = self._not_ready.get(service, {})
        if waiting:
            return "; ".join(f"{pg}: {why}" for pg, why in waiting.items())
        if self._by_service.get(service):
            return "every replica is paused"
        return "no placement group is running it"

    def choose(self, service: str, exclude: frozenset[str] = frozenset()) -> Replica | None:
        best: Replica | None = None
        for r in self._by_service.get(service, {}).values():
            if r.pg_id in exclude or not self._admits(r):
                continue
            if best is None or (r.pressure, r.in_flight) < (best.pressure, best.in_flight):
                best = r
        return best
