"""The main's capacity controller, on the gateway's event loop.

- **Loads on demand.** A request for a managed model with no usable group asks
  :meth:`CapacityController.admit_load`: a load starts (or is already under
  way) and the request waits in the admission queue, its wait counting
  against the queue timeout. The load places one group with the install
  planner; when nothing fits it evicts the cheapest idle on-demand group
  (letsinfer.capacity.eviction) and plans again. A model that can never fit,
  or that nothing could make room for, is refused at once: 503
  ``capacity_exhausted`` with the reason. Never a loop of loads.
- **Unloads when idle.** An on-demand model with no request for its idle time
  (and resident past its minimum) loses its groups.
- **Follows load.** Between ``--min`` and ``--max``: a group more while the
  requests in flight per group stay above the target (or requests wait) for
  ``scale_up_after_s``; one fewer, drained first, after ``scale_down_s`` calm.

Everything is decided from the gateway's own figures (replicas' requests in
flight and taken, the queue's depth); the authority is read only here, off
the request path, and every load, unload, eviction and scale step is audited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from letsinfer.capacity import eviction
from letsinfer.capacity.policy import ScalingPolicy, duration_text
from letsinfer.config import CapacitySettings
from letsinfer.gateway.errors import GatewayError

if TYPE_CHECKING:
    from letsinfer.capacity.metrics import CapacityMetrics
    from letsinfer.capacity.placing import Placer
    from letsinfer.gateway.admission import Admission
    from letsinfer.gateway.directory import Directory
    from letsinfer.gateway.routing import RoutingTable
    from letsinfer.store import NodeRecord

log = logging.getLogger("letsinfer.node")

State = Literal["loaded", "loading", "unloaded", "scaling"]
_RECENT_TAU_S = 120.0  # how long a request counts towards "used lately"
_NO_ROOM_BACKOFF_S = 30.0  # a scale-out that found no room is not tried again sooner
_FAILED_RETRY_S = 30  # Retry-After for a load that failed (its engine was parked, ...)
_PLACEMENTS_PER_LOAD = 3  # a load whose node is lost is placed elsewhere, this often at most


def capacity_exhausted(service: str, why: str, retry_after: int) -> GatewayError:
    """A load that cannot happen, or that failed: 503 with the reason."""
    return GatewayError(
        503,
        f"Model '{service}' cannot be loaded: {why}.",
        type_="server_error",
        code="capacity_exhausted",
        headers={"retry-after": str(retry_after)},
    )


@dataclass
class _Model:
    last_active: float
    taken: int = 0  # the replicas' taken counters, summed, at the last look
    recent: float = 0.0  # requests lately, decayed
    reload_s: float | None = None  # the last load's measured time
    busy_since: float | None = None
    calm_since: float | None = None
    no_room_until: float = 0.0  # a scale-out that found no room waits until then
    loaded_at: dict[str, float] = field(default_factory=dict)  # pg -> monotonic


class CapacityController:
    def __init__(
        self,
        placer: Placer,
        routing: RoutingTable,
        directory: Directory,
        apply_now: Callable[[], None],
        settings: CapacitySettings | None = None,
        metrics: CapacityMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        placed_on: Callable[[NodeRecord], None] = lambda node: None,
    ) -> None:
        """``placed_on(node)`` asks a child the controller placed a group on to
        report now (fire and forget): it hears of the group at once, not at
        its next heartbeat."""
        self.placer = placer
        self.placed_on = placed_on
        self.routing = routing
        self.directory = directory
        self.apply_now = apply_now
        self.settings = settings or CapacitySettings()
        self.metrics = metrics
        self.clock = clock
        self.admission: Admission | None = None  # set by the gateway that asks
        self._models: dict[str, _Model] = {}
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._draining: dict[str, asyncio.Task[None]] = {}  # pg -> its scale-down
        # Each managed model's state at the last round (metrics, `top`).
        self.states: dict[str, str] = {}
        # Loads waiting for room, oldest first: only the first may evict, so
        # each gets its turn (a load that looked last must not always win).
        self._needs_room: list[str] = []
        # Busy groups drained to make room (pg -> the model loading), evicted
        # once their requests finish (eviction.to_drain).
        self._room_drains: dict[str, str] = {}

    # -- what the gateway asks (on its loop; no database) -----------------------
    def policy(self, service: str) -> ScalingPolicy | None:
        """The model's policy when it is not the default (None: not managed)."""
        try:
            entry = self.directory.current().names.get(service)
        except Exception:
            return None
        return entry.scaling if entry is not None else None

    def admit_load(self, service: str) -> bool:
        """No usable group of ``service``: True when a load is under way (the
        request waits for it), False when the model is not loaded on demand."""
        if service in self._loads:
            return True
        policy = self.policy(service)
        if policy is None:
            return False
        snapshot = self.directory.current()
        entry = snapshot.names[service]
        if snapshot.system_stopped or (entry.groups and not entry.running):
            return False  # stopped by an administrator: not this controller's to undo
        if entry.groups and self.routing.parked(service):
            return False  # its engine keeps failing: model_parked says why
        self._start_load(service, "a request")
        return True

    def loading(self, service: str) -> bool:
        return service in self._loads

    def state(self, service: str) -> State | None:
        """loaded, loading, unloaded or scaling; None for a model not managed."""
        if self.policy(service) is None:
            return None
        ready = self.routing.ready_count(service)
        if service in self._loads:
            return "scaling" if ready else "loading"
        if ready:
            return "loaded"
        entry = self.directory.current().names.get(service)
        return "loading" if entry is not None and entry.groups else "unloaded"

    # -- loads ------------------------------------------------------------------
    def _model(self, service: str) -> _Model:
        found = self._models.get(service)
        if found is None:
            found = self._models[service] = _Model(last_active=self.clock())
        return found

    def _start_load(self, service: str, reason: str) -> None:
        task = asyncio.get_running_loop().create_task(
            self._load(service, reason), name=f"load {service}"
        )
        self._loads[service] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._loads.get(service) is t:
                del self._loads[service]
            if not t.cancelled() and t.exception() is not None:
                log.error("loading %s failed", service, exc_info=t.exception())
                self._refuse(
                    service, capacity_exhausted(service, "an internal error", _FAILED_RETRY_S)
                )

        task.add_done_callback(done)

    def _waiting(self, service: str) -> int:
        return self.admission.depth(service) if self.admission is not None else 0

    def _refuse(self, service: str, error: GatewayError) -> None:
        if self.admission is not None:
            self.admission.refuse_waiters(service, error)

    async def _load(self, service: str, reason: str) -> None:
        try:
            for _ in range(_PLACEMENTS_PER_LOAD):
                if not await self._place_and_wait(service, reason):
                    return
                reason = f"{reason}; its first node was lost during the load"
        finally:
            if service in self._needs_room:
                self._needs_room.remove(service)
            # A group drained for this load that is still there (the load ended
            # without needing it: its clients left, or it failed) serves again.
            kept = {pg for pg, wanted in self._room_drains.items() if wanted == service}
            if kept:
                for pg in kept:
                    del self._room_drains[pg]
                self.routing.undrain(kept)

    async def _place_and_wait(self, service: str, reason: str) -> bool:
        """Place one group and wait for it; True when its node was lost
        meanwhile (its group gone again): the caller places it elsewhere."""
        started = self.clock()
        deadline = started + self.settings.load_timeout_s
        evicted_at: float | None = None
        while True:
            found = self.placer.find(service)
            if found.placement is not None:
                break
            never = self.placer.never_fits(service)
            if never is not None:
                self._exhausted(service, never)
                return False
            if self.routing.ready_count(service):
                # A scale-out: it evicts nobody (its model serves already).
                self._exhausted(service, found.reasons())
                return False
            residents = self._residents()
            if service not in self._needs_room:
                self._needs_room.append(service)
            settled = evicted_at is None or self.clock() - evicted_at >= self.settings.settle_s
            if settled and self._needs_room[0] == service:
                rule = self.settings.eviction
                victim = eviction.choose(residents, service, rule)
                asking = eviction.Waiting(
                    service,
                    self._waiting(service),
                    self._model(service).recent,
                    self.clock() - started,
                    self._patience(service, self.clock() - started),
                )
                defer_s = self.settings.max_defer_s
                if victim is not None and (
                    rule == "lru" or eviction.worth_swapping(victim, asking, defer_s, residents)
                ):
                    if self._evict(victim, service):
                        evicted_at = self.clock()
                        continue
                elif rule != "lru":  # no group may go now, or a cheaper busy one should
                    busy = eviction.to_drain(residents, asking, defer_s, idle=victim)
                    if busy is not None:
                        self._drain_for_room(busy, service)
                if victim is None and not eviction.may_free_later(residents, service):
                    self._exhausted(service, found.reasons())
                    return False
            if reason == "a request" and not self._waiting(service):
                return False  # every client left (or timed out): no room to make
            if self.clock() > deadline:
                self._exhausted(service, f"no room within {self.settings.load_timeout_s:g}s")
                return False
            await asyncio.sleep(0.2)
        # Room found: the next load waiting for room may make its own now (on
        # another GPU) rather than wait for this engine to come up.
        if service in self._needs_room:
            self._needs_room.remove(service)
        placement = found.placement
        placed_at = self.clock()
        pg_id = self.placer.load(service, placement, reason)
        log.info(
            "model %s: loading on %s (%s), for %s", service, placement.node.name, pg_id, reason
        )
        if self.metrics is not None:
            self.metrics.loads.labels(service, _reason_label(reason)).inc()
        self.apply_now()
        if placement.node.id != self.placer.settings.main_id:
            self.placed_on(placement.node)
        model = self._model(service)
        ready = asyncio.Event()

        def heard(changed: str) -> None:
            if changed == service:
                ready.set()

        self.routing.subscribe(heard)
        try:
            while self.clock() < deadline:
                if any(r.pg_id == pg_id for r in self.routing.replicas(service)):
                    took = self.clock() - started
                    # Its cost of being evicted: the load alone, not the wait for room.
                    model.reload_s = self.clock() - placed_at
                    model.loaded_at[pg_id] = self.clock()
                    model.last_active = self.clock()
                    if self.metrics is not None:
                        self.metrics.load_seconds.labels(service).observe(took)
                    log.info("model %s: loaded in %.1fs (%s)", service, took, pg_id)
                    return False
                parked = self.routing.parked(service).get(pg_id)
                if parked is not None:
                    self._failed(service, pg_id, f"its engine was parked: {parked}")
                    return False
                if self._lost(placement.node.id):
                    log.warning(
                        "model %s: %s lost its node %s during the load; placing it elsewhere",
                        service,
                        pg_id,
                        placement.node.name,
                    )
                    why = f"its node {placement.node.name} was lost during the load"
                    self.placer.unload(service, pg_id, "model.unload", why)
                    self.apply_now()
                    return True
                ready.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ready.wait(), 0.5)
            self._failed(service, pg_id, f"not ready within {self.settings.load_timeout_s:g}s")
            return False
        finally:
            self.routing.unsubscribe(heard)

    def _patience(self, service: str, waited_s: float) -> float:
        """How much longer ``service``'s waiting requests may wait for room and
        still be answered within the queue's wait limit (less a load's time)."""
        if self.admission is None:
            return math.inf
        reload_s = self._model(service).reload_s or eviction.DEFAULT_RELOAD_S
        return self.admission.limits.max_wait_s - waited_s - reload_s

    def _lost(self, node_id: str) -> bool:
        """A child that stopped reporting (or was removed) while a load waited on it."""
        placing = self.placer.settings
        if node_id == placing.main_id:
            return False
        node = self.placer.store.get_node(node_id, facts=False)
        if node is None or node.state != "active":
            return True
        return node.facts_at is None or time.time() - node.facts_at > placing.fresh_within_s

    def _exhausted(self, service: str, why: str) -> None:
        log.warning("model %s: cannot load a group: %s", service, why)
        self.placer.refused(service, why)
        if self.metrics is not None:
            self.metrics.exhausted.labels(service).inc()
        if self.routing.ready_count(service):
            # A scale-out with no room: its groups go on serving (and waiting
            # requests with them); the next try waits a while.
            self._model(service).no_room_until = self.clock() + _NO_ROOM_BACKOFF_S
            return
        retry = max(1, math.ceil(self.settings.interval_s * 5))
        self._refuse(service, capacity_exhausted(service, why, retry))

    def _failed(self, service: str, pg_id: str, why: str) -> None:
        """A load whose group did not come up: its waiters are told; the group
        stays as issue 12's rules leave it (parked, with its reason)."""
        log.warning("model %s: load of %s failed: %s", service, pg_id, why)
        self._refuse(
            service, capacity_exhausted(service, f"it did not load: {why}", _FAILED_RETRY_S)
        )

    # -- eviction -----------------------------------------------------------------
    def _residents(self) -> list[eviction.Resident]:
        now_wall = time.time()
        by_pg = {r.pg_id: r for s in self.routing.services() for r in self.routing.replicas(s)}
        out = []
        for pg in self.placer.store.list_placement_groups():
            policy = self.policy(pg.service)
            replica = by_pg.get(pg.id)
            model = self._models.get(pg.service)
            loaded = model.loaded_at.get(pg.id) if model else None
            resident = self.clock() - loaded if loaded is not None else now_wall - pg.created_at
            out.append(
                eviction.Resident(
                    pg_id=pg.id,
                    service=pg.service,
                    node_id=pg.node_id,
                    on_demand=policy is not None and policy.on_demand,
                    in_flight=replica.in_flight if replica else 0,
                    waiting=self._waiting(pg.service),
                    resident_s=resident,
                    min_resident_s=policy.min_resident_s if policy else math.inf,
                    reload_s=model.reload_s if model else None,
                    recent_requests=model.recent if model else 0.0,
                    idle_s=self.clock() - model.last_active if model else math.inf,
                    draining=pg.id in self._room_drains,
                )
            )
        return out

    def _evict(self, victim: eviction.Resident, for_service: str) -> bool:
        """Unload ``victim`` now if it is still idle (checked and drained in one
        turn of the loop, so no request can take a slot between)."""
        self.routing.drain({victim.pg_id})
        if self.routing.in_flight({victim.pg_id}):
            if victim.pg_id not in self._room_drains:  # (one drained for room stays so)
                self.routing.undrain({victim.pg_id})
            return False
        why = f"makes room for {for_service}"
        if not self.placer.unload(victim.service, victim.pg_id, "model.evict", why):
            return False
        self._room_drains.pop(victim.pg_id, None)
        log.info(
            "model %s: evicted %s to make room for %s", victim.service, victim.pg_id, for_service
        )
        if self.metrics is not None:
            self.metrics.evictions.labels(victim.service).inc()
        self._forget_group(victim.service, victim.pg_id)
        self.apply_now()
        return True

    def _drain_for_room(self, busy: eviction.Resident, for_service: str) -> None:
        """``for_service`` deferred its bound: ``busy`` admits nothing new and
        goes once its requests finish. Requests waiting for its model wait for
        a load of their own (queued behind this one), not refused."""
        if busy.service not in self._loads and self._waiting(busy.service):
            self._start_load(busy.service, "a request")
        self._room_drains[busy.pg_id] = for_service
        self.routing.drain({busy.pg_id})
        log.info(
            "model %s: draining %s to make room for %s (waited %s)",
            busy.service,
            busy.pg_id,
            for_service,
            duration_text(self.settings.max_defer_s),
        )

    def _forget_group(self, service: str, pg_id: str) -> None:
        model = self._models.get(service)
        if model is not None:
            model.loaded_at.pop(pg_id, None)

    # -- the round: idle unloads and replica counts ---------------------------------
    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval_s)
            try:
                self.round()
            except Exception:  # a bad row must not end the loop
                log.exception("the capacity round failed")

    def round(self) -> None:
        try:
            snapshot = self.directory.current()
        except Exception:
            return
        now = self.clock()
        managed = {e.name: e.scaling for e in snapshot.services if e.scaling is not None}
        groups_by_service: dict[str, list[str]] = {}
        for pg in self.placer.store.list_placement_groups():
            if pg.service in managed and pg.desired == "running":
                groups_by_service.setdefault(pg.service, []).append(pg.id)
        for service, policy in managed.items():
            self._look(service, policy, groups_by_service.get(service, []), now, snapshot)
        self.states = {service: self.state(service) or "loaded" for service in managed}
        if self.metrics is not None:
            for service in managed:
                self.metrics.groups.labels(service).set(len(groups_by_service.get(service, [])))

    def _look(
        self, service: str, policy: ScalingPolicy, groups: list[str], now: float, snapshot: object
    ) -> None:
        model = self._model(service)
        replicas = self.routing.replicas(service)
        taken = sum(r.taken for r in replicas)
        fresh = max(0, taken - model.taken) if taken >= model.taken else taken
        model.taken = taken
        model.recent = model.recent * math.exp(-self.settings.interval_s / _RECENT_TAU_S) + fresh
        in_flight = sum(r.in_flight for r in replicas)
        waiting = self._waiting(service)
        if fresh or in_flight or waiting:
            model.last_active = now
        for pg in groups:
            model.loaded_at.setdefault(pg, now)
        if service in self._loads or getattr(snapshot, "system_stopped", False):
            return
        entry = self.directory.current().names.get(service)
        if entry is not None and entry.groups and not entry.running:
            return  # stopped by an administrator
        if entry is not None and entry.canary is not None:
            return  # a canary's two sides stay as they are until promote or abort
        if any(self.routing.holds(pg) for pg in groups):
            return  # a gate is judging a new group: one group more, for now
        live = [pg for pg in groups if pg not in self._draining]
        n = len(live)
        if n < policy.min_groups:
            self._start_load(service, f"its minimum of {policy.min_groups} group(s)")
            return
        if n > policy.max_groups:
            self._scale_down(service, live, f"its maximum is {policy.max_groups}")
            return
        idle_for = now - model.last_active
        resident = min((now - model.loaded_at[pg] for pg in live), default=0.0)
        if (
            policy.on_demand
            and n
            and not (in_flight or waiting)
            and idle_for >= policy.idle_s
            and resident >= policy.min_resident_s
        ):
            self._unload_idle(service, live, f"no request for {duration_text(round(idle_for))}")
            return
        ready = max(len(replicas), 1)
        per_group = in_flight / ready
        busy = per_group > policy.target_inflight or waiting
        if n and n < policy.max_groups and busy and now >= model.no_room_until:
            model.calm_since = None
            if model.busy_since is None:
                model.busy_since = now
            elif now - model.busy_since >= self.settings.scale_up_after_s:
                model.busy_since = None
                self._start_load(
                    service,
                    f"{per_group:.1f} requests in flight per group (target "
                    f"{policy.target_inflight:g}), {waiting} waiting",
                )
            return
        model.busy_since = None
        floor = max(policy.min_groups, 1)
        if n > floor and per_group < policy.target_inflight / 2 and not waiting:
            if model.calm_since is None:
                model.calm_since = now
            elif now - model.calm_since >= policy.scale_down_s:
                model.calm_since = None
                self._scale_down(
                    service, live, f"calm for {duration_text(round(policy.scale_down_s))}"
                )
        else:
            model.calm_since = None

    def _unload_idle(self, service: str, groups: list[str], why: str) -> None:
        pgs = set(groups)
        self.routing.drain(pgs)
        if self.routing.in_flight(pgs):  # (cannot be: idle was just seen on this loop)
            self.routing.undrain(pgs)
            return
        for pg in groups:
            if self.placer.unload(service, pg, "model.unload", why):
                self._forget_group(service, pg)
                if self.metrics is not None:
                    self.metrics.unloads.labels(service, "idle").inc()
        log.info("model %s: unloaded (%s)", service, why)
        self.apply_now()

    def _scale_down(self, service: str, groups: list[str], why: str) -> None:
        """One group fewer: the one with the fewest requests, drained first."""
        in_flight = {r.pg_id: r.in_flight for r in self.routing.replicas(service)}
        pg = min(groups, key=lambda g: (in_flight.get(g, 0), g))
        self.routing.drain({pg})
        self._draining[pg] = asyncio.get_running_loop().create_task(
            self._drained_then_removed(service, pg, why), name=f"scale down {pg}"
        )

    async def _drained_then_removed(self, service: str, pg: str, why: str) -> None:
        try:
            deadline = self.clock() + self.settings.drain_timeout_s
            while self.routing.in_flight({pg}) and self.clock() < deadline:
                await asyncio.sleep(0.1)
            if self.placer.unload(service, pg, "model.scale", f"one group fewer: {why}"):
                self._forget_group(service, pg)
                if self.metrics is not None:
                    self.metrics.unloads.labels(service, "scale").inc()
                log.info("model %s: scaled down, %s removed (%s)", service, pg, why)
            self.apply_now()
        finally:
            self._draining.pop(pg, None)

    async def aclose(self) -> None:
        tasks = [*self._loads.values(), *self._draining.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _reason_label(reason: str) -> str:
    """A bounded metric label for a load's reason."""
    if reason == "a request":
        return "request"
    if reason.startswith("its minimum"):
        return "minimum"
    return "load"
