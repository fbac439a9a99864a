"""Whether a swap is worth it (letsinfer.capacity.eviction): requests for a
resident model are served before a request for a model that is out forces a
swap, and a waiting request defers at most ``[capacity] max_defer_s``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

from letsinfer.capacity.controller import CapacityController
from letsinfer.capacity.eviction import Resident, Waiting, choose, to_drain, worth_swapping
from letsinfer.capacity.placing import Found
from letsinfer.capacity.policy import ScalingPolicy
from letsinfer.config import CapacitySettings
from letsinfer.gateway.admission import AdmissionLimits
from letsinfer.gateway.routing import Replica, RoutingTable

DEFER_S = 5.0


def resident(pg: str, **kw: object) -> Resident:
    base: dict[str, object] = dict(
        pg_id=pg,
        service=pg,
        node_id="n",
        on_demand=True,
        in_flight=0,
        waiting=0,
        resident_s=100.0,
        min_resident_s=10.0,
        reload_s=2.0,
        recent_requests=0.0,
    )
    base.update(kw)
    return Resident(**base)  # type: ignore[arg-type]


def test_a_model_asked_for_less_defers_to_the_resident_one_then_takes_its_turn() -> None:
    busy_model = resident("popular", recent_requests=40.0)  # idle this instant, used often
    rare = Waiting("rare", waiting=1, recent_requests=3.0, waited_s=0.5)
    assert choose([busy_model], "rare") == busy_model  # it could go...
    assert not worth_swapping(busy_model, rare, DEFER_S)  # ... but is worth more where it is
    # A bounded wait: once the request deferred max_defer_s, the swap happens.
    assert worth_swapping(busy_model, Waiting("rare", 1, 3.0, DEFER_S), DEFER_S)
    # A model asked for as much (its queued requests count) swaps at once.
    crowd = Waiting("crowd", waiting=12, recent_requests=30.0, waited_s=0.1)
    assert worth_swapping(busy_model, crowd, DEFER_S)


def test_the_most_used_model_does_not_go_while_a_cheaper_group_is_only_too_young() -> None:
    """Two GPUs: the popular model on one, a rare model loaded (or loading)
    seconds ago on the other. A third model's load waits for the rare one's residence to end
    rather than evict (or drain) the popular one, as long as its requests can
    wait that long; past that, the popular one goes as before."""
    popular = resident("popular", recent_requests=40.0)  # idle this instant, used often
    just_loaded = resident("rare", recent_requests=1.0, resident_s=4.0)  # 6 s left
    third = Waiting("third", 1, 1.0, DEFER_S, patience_s=20.0)
    assert choose([popular, just_loaded], "third") == popular  # the only one it may take now
    assert not worth_swapping(popular, third, DEFER_S, [popular, just_loaded])
    busy = resident("popular", in_flight=1, recent_requests=40.0)
    assert to_drain([busy, just_loaded], third, DEFER_S) is None
    # Its requests cannot wait 6 s more: the popular group goes, as without the rule.
    hurried = Waiting("third", 1, 1.0, DEFER_S, patience_s=3.0)
    assert worth_swapping(popular, hurried, DEFER_S, [popular, just_loaded])
    assert to_drain([busy, just_loaded], hurried, DEFER_S) == busy
    # Still loading, with requests waiting for it: the same (it serves them, then goes).
    loading = resident("rare", waiting=3, recent_requests=1.0, resident_s=1.0)
    assert not worth_swapping(popular, third, DEFER_S, [popular, loading])
    # A young group that is costlier, or pinned, is no reason to wait.
    for other in (
        resident("rare", recent_requests=90.0, resident_s=4.0),
        resident("rare", on_demand=False, recent_requests=1.0, resident_s=4.0),
    ):
        assert worth_swapping(popular, third, DEFER_S, [popular, other])


def test_the_most_used_model_does_not_go_while_a_cheaper_group_is_only_busy() -> None:
    """Requests that take GPU time: the popular model idle this instant, a rare
    one past its residence answering a request. The rare one is drained once the
    wait is due (it goes when its request finishes), not the popular one evicted.
    One with requests queued for it is waited for, not drained (they would need
    a load of their own), while the waiting requests have time; a costlier busy
    group is no reason to spare the idle one."""
    popular = resident("popular", recent_requests=40.0)
    answering = resident("rare", in_flight=1, recent_requests=1.0)
    third = Waiting("third", 1, 1.0, DEFER_S)
    assert choose([popular, answering], "third") == popular  # the only idle one...
    assert not worth_swapping(popular, third, DEFER_S, [popular, answering])  # ... stays
    early = Waiting("third", 1, 1.0, 1.0)
    assert to_drain([popular, answering], early, DEFER_S, idle=popular) is None  # not yet
    assert to_drain([popular, answering], third, DEFER_S, idle=popular) == answering
    # Being drained, it still spares the idle one: both would go otherwise.
    draining = resident("rare", in_flight=1, recent_requests=1.0, draining=True)
    assert not worth_swapping(popular, third, DEFER_S, [popular, draining])
    # Drained and done, it is the one that goes.
    done = resident("rare", recent_requests=1.0, draining=True)
    assert choose([popular, done], "third") == done
    queued = resident("rare", in_flight=1, waiting=2, recent_requests=1.0)
    assert not worth_swapping(popular, third, DEFER_S, [popular, queued])
    assert to_drain([popular, queued], third, DEFER_S, idle=popular) is None
    out_of_time = Waiting("third", 1, 1.0, DEFER_S, patience_s=0.0)
    assert worth_swapping(popular, out_of_time, DEFER_S, [popular, queued])
    costlier = resident("rare", in_flight=1, recent_requests=90.0)
    assert worth_swapping(popular, third, DEFER_S, [popular, costlier])
    assert to_drain([popular, costlier], third, DEFER_S, idle=popular) is None


def test_a_busy_group_past_its_residence_is_drained_once_the_wait_is_due() -> None:
    """Steady requests for the resident model never leave it idle: after the
    bound the cheapest busy group past its residence is drained (never a
    pinned one, a young one, or the loading model's own)."""
    streaming = resident("streaming", in_flight=2, recent_requests=20.0)
    heavy = resident("heavy", in_flight=1, recent_requests=90.0)
    young = resident("young", in_flight=1, resident_s=3.0, recent_requests=30.0)
    pinned = resident("pinned", in_flight=1, on_demand=False)
    own = resident("other", service="rare", in_flight=1)
    everyone = [streaming, heavy, young, pinned, own]
    assert to_drain(everyone, Waiting("rare", 1, 0.0, 1.0), DEFER_S) is None  # not yet
    assert to_drain(everyone, Waiting("rare", 1, 0.0, DEFER_S), DEFER_S) == streaming
    assert to_drain([young, pinned, own], Waiting("rare", 1, 0.0, 60.0), DEFER_S) is None
    # Drained, it goes once its requests finish, whatever waits for its model.
    drained = resident("streaming", waiting=3, draining=True)
    assert drained.evictable and choose([drained], "rare") == drained
    assert not resident("streaming", waiting=3).evictable
    assert to_drain([drained, heavy], Waiting("rare", 1, 0.0, 60.0), DEFER_S) is None


# -- the controller keeps to it (a fake clock, a fake planner; no engine) --------------
class _Placer:
    """One GPU, held by ``groups``: nothing fits until a group goes."""

    def __init__(self, groups: dict[str, str]) -> None:
        self.groups = dict(groups)  # pg -> model
        self.gone: list[tuple[str, str]] = []  # (pg, audit action)
        self.settings = SimpleNamespace(main_id="main", fresh_within_s=30.0)
        self.store = SimpleNamespace(list_placement_groups=self._listed)

    def _listed(self) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(id=pg, service=s, node_id="main", created_at=0.0, desired="running")
            for pg, s in self.groups.items()
        ]

    def find(self, service: str) -> Found:
        return Found(None, (("main", "its only GPU is taken"),))

    def never_fits(self, service: str) -> None:
        return None

    def unload(self, service: str, pg: str, action: str, why: str) -> bool:
        self.gone.append((pg, action))
        return self.groups.pop(pg, None) is not None

    def refused(self, service: str, why: str) -> None:
        pass


def _controller(
    placer: _Placer, routing: RoutingTable, now: list[float], waiting: dict[str, int]
) -> CapacityController:
    on_demand = ScalingPolicy(min_groups=0, min_resident_s=10.0)
    names = {
        s: SimpleNamespace(scaling=on_demand, groups=(), running=True, canary=None)
        for s in ("popular", "rare")
    }
    directory = SimpleNamespace(
        current=lambda: SimpleNamespace(names=names, services=[], system_stopped=False)
    )
    controller = CapacityController(
        placer,  # type: ignore[arg-type]
        routing,
        directory,  # type: ignore[arg-type]
        lambda: None,
        CapacitySettings(settle_s=0.0, max_defer_s=DEFER_S),
        clock=lambda: now[0],
    )
    controller.admission = SimpleNamespace(  # type: ignore[assignment]
        limits=AdmissionLimits(),
        depth=lambda service=None: waiting.get(service, 0) if service else sum(waiting.values()),
        refuse_waiters=lambda service, error: None,
    )
    popular = controller._model("popular")
    popular.recent, popular.loaded_at = 40.0, {"pg-popular": now[0] - 100.0}
    return controller


def _until(what: str, check: Callable[[], bool]) -> Awaitable[None]:
    async def polled() -> None:
        while not check():
            await asyncio.sleep(0.05)

    return asyncio.wait_for(polled(), 30)


def test_the_controller_defers_a_swap_for_a_rarer_model_until_the_bound() -> None:
    """The old rule evicted the popular model's idle group at once for one
    request of a rare model; now the request defers, then gets its turn."""

    async def scenario() -> None:
        now = [1000.0]
        routing = RoutingTable(clock=lambda: now[0])
        routing.publish(Replica("pg-popular", "popular", "http://e", "Bearer k", 4, "main"))
        placer = _Placer({"pg-popular": "popular"})
        controller = _controller(placer, routing, now, {"rare": 1})
        load = asyncio.create_task(controller._place_and_wait("rare", "a request"))
        try:
            looks = 0
            while looks < 5:  # the load looks every 0.2 s: five looks, no swap
                await asyncio.sleep(0.2)
                looks += 1
            assert placer.gone == [], "a rare model's request evicted the popular model at once"
            now[0] += DEFER_S  # the request has deferred its bound
            await _until("the swap", lambda: bool(placer.gone))
            assert placer.gone == [("pg-popular", "model.evict")]
        finally:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)

    asyncio.run(scenario())


def test_a_group_never_idle_is_drained_for_a_waiting_model_after_the_bound() -> None:
    async def scenario() -> None:
        now = [1000.0]
        routing = RoutingTable(clock=lambda: now[0])
        replica = Replica("pg-popular", "popular", "http://e", "Bearer k", 4, "main")
        routing.publish(replica)
        replica.in_flight = 2  # steady requests: it is never idle
        placer = _Placer({"pg-popular": "popular"})
        controller = _controller(placer, routing, now, {"rare": 1})
        load = asyncio.create_task(controller._place_and_wait("rare", "a request"))
        try:
            await asyncio.sleep(0.5)
            assert routing.ready_count("popular") == 1 and not placer.gone
            now[0] += DEFER_S
            await _until("the drain", lambda: routing.ready_count("popular") == 0)
            assert not placer.gone, "its requests in flight finish first"
            replica.in_flight = 0
            await _until("the swap", lambda: bool(placer.gone))
            assert placer.gone == [("pg-popular", "model.evict")]
        finally:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)

    asyncio.run(scenario())


def test_a_canary_or_a_group_a_gate_judges_is_not_scaled_away() -> None:
    """A model at its maximum of one group with a second beside it: the
    capacity round takes one away, unless the second is a canary (both sides
    stay until promote or abort) or a group a gate is judging."""

    async def scenario(canary: bool, held: bool) -> list[str]:
        now = [1000.0]
        routing = RoutingTable(clock=lambda: now[0])
        for pg in ("pg-old", "pg-new"):
            routing.publish(Replica(pg, "chat", "http://e", "Bearer k", 4, "main"))
        if held:
            routing.hold({"pg-new"})
        placer = _Placer({"pg-old": "chat", "pg-new": "chat"})
        policy = ScalingPolicy(min_groups=1, max_groups=1)
        entry = SimpleNamespace(
            name="chat",
            scaling=policy,
            groups=("pg-old", "pg-new"),
            running=True,
            canary=("pg-new", 0.3) if canary else None,
        )
        directory = SimpleNamespace(
            current=lambda: SimpleNamespace(
                names={"chat": entry}, services=[entry], system_stopped=False
            )
        )
        controller = CapacityController(
            placer,  # type: ignore[arg-type]
            routing,
            directory,  # type: ignore[arg-type]
            lambda: None,
            CapacitySettings(settle_s=0.0),
            clock=lambda: now[0],
        )
        controller.admission = SimpleNamespace(  # type: ignore[assignment]
            depth=lambda service=None: 0, refuse_waiters=lambda service, error: None
        )
        controller.round()
        drained = sorted(routing.draining())
        for task in controller._draining.values():
            task.cancel()
        await asyncio.gather(*controller._draining.values(), return_exceptions=True)
        return drained

    assert asyncio.run(scenario(canary=False, held=False)) != []  # one group too many: it goes
    assert asyncio.run(scenario(canary=True, held=False)) == []
    assert asyncio.run(scenario(canary=False, held=True)) == []


class _TwoGpus(_Placer):
    """Two GPUs, each held by one group: a load takes a GPU that is free."""

    def __init__(self, groups: dict[str, str]) -> None:
        super().__init__(groups)
        self.loading: list[str] = []  # models whose engines were started, in order

    def find(self, service: str) -> Found:
        if len(self.groups) >= 2:
            return Found(None, (("main", "both GPUs are taken"),))
        node = SimpleNamespace(id="main", name="main")
        return Found(SimpleNamespace(node=node), ())  # type: ignore[arg-type]

    def load(self, service: str, placement: object, reason: str) -> str:
        pg = f"pg-{service}"
        self.groups[pg] = service
        self.loading.append(service)
        return pg


def test_two_loads_for_two_gpus_make_room_side_by_side() -> None:
    """A load whose engine is starting holds no other load back: the second
    model evicts the other idle group at once instead of waiting until the
    first engine answers (loads were one at a time on the whole cluster)."""

    async def scenario() -> None:
        now = [1000.0]
        routing = RoutingTable(clock=lambda: now[0])
        for model in ("popular", "rare"):
            routing.publish(Replica(f"pg-{model}", model, "http://e", "Bearer k", 4, "main"))
        placer = _TwoGpus({"pg-popular": "popular", "pg-rare": "rare"})
        controller = _controller(placer, routing, now, {"third": 2, "fourth": 2})
        on_demand = ScalingPolicy(min_groups=0, min_resident_s=10.0)
        names = controller.directory.current().names
        for model in ("third", "fourth"):
            names[model] = SimpleNamespace(scaling=on_demand, groups=(), running=True, canary=None)
            controller._model(model).recent = 50.0  # asked for more than either resident
        controller._model("rare").loaded_at = {"pg-rare": now[0] - 100.0}
        loads = [
            asyncio.create_task(controller._place_and_wait(model, "a request"))
            for model in ("third", "fourth")
        ]
        try:
            # Neither engine ever answers here: both loads must still begin.
            await _until("both loads", lambda: len(placer.loading) == 2)
            assert placer.loading == ["third", "fourth"]
            assert sorted(placer.gone) == [
                ("pg-popular", "model.evict"),
                ("pg-rare", "model.evict"),
            ]
        finally:
            for load in loads:
                load.cancel()
            await asyncio.gather(*loads, return_exceptions=True)

    asyncio.run(scenario())
