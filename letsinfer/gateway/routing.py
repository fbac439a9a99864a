"""The replicas (placement groups) that can serve each model, as plain data.

Replicas appear when their engine reports ready (healthy and proven) and
disappear the moment it stops being ready. A model with a canary
(letsinfer.lifecycle.canary) sends its share of new requests to that one
group and the rest to its others: one random draw per request, and none for
a model without one. A group whose engine kept failing
to start is parked, with its reason: the gateway refuses its model at once
instead of asking clients to retry. A draining group admits nothing new while
its requests in flight finish (lifecycle changes). Which one serves a request is decided by
:mod:`letsinfer.gateway.policy`; waiting for a free one by
:mod:`letsinfer.gateway.admission`. Listeners hear about every change, so
requests waiting for capacity learn at once that a replica appeared or that
none is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from random import random

from letsinfer.gateway.providers import ExternalModel


@dataclass(eq=False)
class Replica:
    pg_id: str
    service: str
    base_url: str
    authorization: str  # "Bearer <per-replica engine key>"
    capacity: int  # requests the engine runs at once (its slots); never exceeded
    node_id: str = ""
    paused: bool = False
    in_flight: int = 0  # the gateway's own count of requests at this replica
    taken: int = 0  # requests it was ever given: capacity's measure of use (letsinfer.capacity)
    # Facts the replica's agent reports (signed and checked upstream of here);
    # None when not reported. facts_at is the table's clock() at the report.
    slots_free: int | None = None
    queue_depth: int | None = None
    temperature_c: float | None = None
    facts_at: float | None = None
    # The LoRA adapters its engine loaded, in load order: an adapter's index
    # is the id a request names in llama.cpp's per-request ``lora`` field.
    adapters: tuple[str, ...] = ()
    # Set for an external model: the provider it stands for (letsinfer.gateway.external).
    external: ExternalModel | None = None

    @property
    def pressure(self) -> float:
        return self.in_flight / max(self.capacity, 1)

    @property
    def full(self) -> bool:
        return self.in_flight >= self.capacity


@dataclass(frozen=True)
class ReplicaFacts:
    """What the latest verified facts say about a replica's engine (None: not
    said). ``at`` is the routing table's clock() when they arrived: older
    than the policy's fact_max_age_s, the replica is not chosen."""

    at: float
    slots_free: int | None = None
    queue_depth: int | None = None
    temperature_c: float | None = None  # the hottest of its GPUs


Listener = Callable[[str], None]  # called with the model service whose replicas changed


@dataclass
class RoutingTable:
    """Owned by the gateway's event loop: changes made elsewhere (the control
    plane's thread) are posted to that loop (letsinfer/control/thread.py)."""

    # What facts' ages are read on: monotonic seconds; on a main its attention
    # clock, which stands still while it sheds load (letsinfer.authority.overload).
    clock: Callable[[], float] = time.monotonic
    _by_service: dict[str, dict[str, Replica]] = field(default_factory=dict)
    # Groups that exist but are not ready, with why: explains a 503.
    _not_ready: dict[str, dict[str, str]] = field(default_factory=dict)
    # Groups whose engine is parked (not restarted), with the reason.
    _parked: dict[str, dict[str, str]] = field(default_factory=dict)
    # Groups admitting nothing new while their requests in flight finish.
    _draining: set[str] = field(default_factory=set)
    # Groups held out of clients' traffic: only a request pinned to one (a
    # gate's eval, letsinfer.lifecycle.weights) reaches it (letsinfer.gateway.upstream).
    _held: set[str] = field(default_factory=set)
    _listeners: list[Listener] = field(default_factory=list)
    # Read by the policy on every request: rebuilt on change, not per request.
    _lists: dict[str, tuple[Replica, ...]] = field(default_factory=dict)
    # Models with a canary: its group and its share (0..1), from the directory.
    _canaries: dict[str, tuple[str, float]] = field(default_factory=dict)
    # Those whose both sides can take requests now: (share, the canary's
    # replicas, the others'); rebuilt on change, like _lists.
    _splits: dict[str, tuple[float, tuple[Replica, ...], tuple[Replica, ...]]] = field(
        default_factory=dict
    )

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _changed(self, service: str) -> None:
        replicas = tuple(self._by_service.get(service, {}).values())
        self._lists[service] = replicas
        self._split(service, replicas)
        for listener in self._listeners:
            listener(service)

    def _split(self, service: str, replicas: tuple[Replica, ...]) -> None:
        canary = self._canaries.get(service)
        if canary is not None:
            pg_id, share = canary
            ours = tuple(r for r in replicas if r.pg_id == pg_id)
            theirs = tuple(r for r in replicas if r.pg_id != pg_id)
            # A side with nothing admitting (not ready yet, draining to be
            # removed) takes nothing: the other side has all of them.
            if any(not r.paused for r in ours) and any(not r.paused for r in theirs):
                self._splits[service] = (share, ours, theirs)
                return
        self._splits.pop(service, None)

    def set_canaries(self, canaries: dict[str, tuple[str, float]]) -> None:
        """Each model with a canary: its group and the share (0..1) of the
        model's new requests it takes (from the directory's snapshot)."""
        if canaries == self._canaries:
            return
        changed = self._canaries.keys() | canaries.keys()
        self._canaries = dict(canaries)
        for service in changed:
            self._changed(service)

    def routed(self, service: str) -> tuple[Replica, ...]:
        """The replicas a new request of ``service`` may go to: all of them, or
        for a model with a canary one side, drawn by the canary's share."""
        if self._splits:  # (the only cost for models without a canary)
            split = self._splits.get(service)
            if split is not None:
                return split[1] if random() < split[0] else split[2]
        return self._lists.get(service, ())

    # Paused nodes admit nothing new; their in-flight requests finish.
    _paused_nodes: frozenset[str] = frozenset()

    def set_paused_nodes(self, nodes: set[str]) -> None:
        frozen = frozenset(nodes)
        if frozen == self._paused_nodes:
            return
        self._paused_nodes = frozen
        for service, replicas in self._by_service.items():
            for r in replicas.values():
                r.paused = r.node_id in frozen or r.pg_id in self._draining or r.pg_id in self._held
            self._changed(service)

    def publish(self, replica: Replica) -> None:
        """Add or update a replica. An update changes the published object in
        place: requests in flight hold that object and give their slot back to
        it, so replacing it would leak their count."""
        self._not_ready.get(replica.service, {}).pop(replica.pg_id, None)
        self._parked.get(replica.service, {}).pop(replica.pg_id, None)
        if (
            replica.node_id in self._paused_nodes
            or replica.pg_id in self._draining
            or replica.pg_id in self._held
        ):
            replica.paused = True
        current = self._by_service.setdefault(replica.service, {}).get(replica.pg_id)
        if current is None:
            self._by_service[replica.service][replica.pg_id] = replica
        else:
            for f in fields(Replica):
                if f.name not in ("in_flight", "taken"):
                    setattr(current, f.name, getattr(replica, f.name))
        self._changed(replica.service)

    def observe(self, service: str, pg_id: str, facts: ReplicaFacts) -> None:
        """Set a published replica's facts (in place, like publish)."""
        replica = self._by_service.get(service, {}).get(pg_id)
        if replica is None:
            return
        replica.slots_free = facts.slots_free
        replica.queue_depth = facts.queue_depth
        replica.temperature_c = facts.temperature_c
        replica.facts_at = facts.at
        self._changed(service)  # fresh facts may make a stale replica usable again

    def set_adapters(self, service: str, pg_id: str, adapters: tuple[str, ...]) -> None:
        """The LoRA adapters a published replica's engine has loaded (in place)."""
        replica = self._by_service.get(service, {}).get(pg_id)
        if replica is not None and replica.adapters != adapters:
            replica.adapters = adapters
            self._changed(service)

    def withdraw(self, service: str, pg_id: str, reason: str) -> None:
        self._by_service.get(service, {}).pop(pg_id, None)
        self._parked.get(service, {}).pop(pg_id, None)
        self._not_ready.setdefault(service, {})[pg_id] = reason
        self._changed(service)

    def park(self, service: str, pg_id: str, reason: str) -> None:
        """The group's engine is parked: not ready, and not coming back by itself."""
        self._by_service.get(service, {}).pop(pg_id, None)
        self._not_ready.get(service, {}).pop(pg_id, None)
        self._parked.setdefault(service, {})[pg_id] = reason
        self._changed(service)

    def forget(self, service: str, pg_id: str) -> None:
        self._by_service.get(service, {}).pop(pg_id, None)
        self._not_ready.get(service, {}).pop(pg_id, None)
        self._parked.get(service, {}).pop(pg_id, None)
        self._changed(service)

    def knows(self, service: str) -> bool:
        """Whether any group of ``service`` was ever reported (and not forgotten)."""
        return bool(
            self._by_service.get(service)
            or self._not_ready.get(service)
            or self._parked.get(service)
        )

    def parked(self, service: str) -> dict[str, str]:
        """Parked groups of ``service`` and why."""
        return self._parked.get(service, {})

    def all_parked(self) -> dict[str, dict[str, str]]:
        """A copy (metrics read it from the control plane's thread)."""
        return {service: dict(groups) for service, groups in dict(self._parked).items()}

    def drain(self, pg_ids: set[str]) -> None:
        """Admit nothing new to these groups; their requests in flight finish."""
        self._draining |= pg_ids
        self._mark_draining()

    def draining(self) -> frozenset[str]:
        return frozenset(self._draining)

    def undrain(self, pg_ids: set[str]) -> None:
        self._draining -= pg_ids
        self._mark_draining()

    def hold(self, pg_ids: set[str]) -> None:
        """These groups take no client's request (they may not exist yet: a
        group held before it starts never takes one), only one pinned to them."""
        self._held |= pg_ids
        self._mark_draining()

    def unhold(self, pg_ids: set[str]) -> None:
        self._held -= pg_ids
        self._mark_draining()

    def holds(self, pg_id: str) -> bool:
        """Whether ``pg_id`` is held (a gate judges it), published or not."""
        return pg_id in self._held

    def held(self, service: str, pg_id: str) -> Replica | None:
        """The held group's replica, when it is held and published."""
        if pg_id not in self._held:
            return None
        return self._by_service.get(service, {}).get(pg_id)

    def _mark_draining(self) -> None:
        for service, replicas in self._by_service.items():
            changed = False
            for r in replicas.values():
                paused = (
                    r.node_id in self._paused_nodes
                    or r.pg_id in self._draining
                    or r.pg_id in self._held
                )
                if r.paused != paused:
                    r.paused, changed = paused, True
            if changed:
                self._changed(service)

    def in_flight(self, pg_ids: set[str]) -> int:
        """Requests the gateway has at these groups now."""
        return sum(
            r.in_flight
            for replicas in self._by_service.values()
            for r in replicas.values()
            if r.pg_id in pg_ids
        )

    def set_paused(self, service: str, pg_id: str, paused: bool) -> None:
        replica = self._by_service.get(service, {}).get(pg_id)
        if replica is not None:
            replica.paused = paused
            self._changed(service)

    def replicas(self, service: str) -> tuple[Replica, ...]:
        return self._lists.get(service, ())

    def ready_count(self, service: str) -> int:
        return sum(1 for r in self.replicas(service) if not r.paused)

    def services(self) -> list[str]:
        return list(self._lists)

    def explain(self, service: str) -> str:
        waiting = {
            **{pg: f"parked: {why}" for pg, why in self._parked.get(service, {}).items()},
            **self._not_ready.get(service, {}),
        }
        if waiting:
            return "; ".join(f"{pg}: {why}" for pg, why in waiting.items())
        replicas = self._by_service.get(service)
        if replicas:
            if all(r.node_id in self._paused_nodes for r in replicas.values()):
                return (
                    "every replica is on a node an administrator paused; "
                    "`letsinfer node resume` admits requests again"
                )
            if all(r.pg_id in self._draining for r in replicas.values()):
                return "every replica is draining for a restart or an upgrade"
            return "every replica is paused or its facts are stale"
        return "no placement group is running it"
