"""Replica choice and admission as plain data: no servers."""

from __future__ import annotations

import asyncio
import math
import threading
from collections import Counter

import pytest

from letsinfer.authority.facts import NodeView
from letsinfer.authority.pressure import group_facts
from letsinfer.contracts.facts import Facts, GpuFact, PlacementFact
from letsinfer.gateway import policy, protocol
from letsinfer.gateway.admission import Admission, AdmissionLimits
from letsinfer.gateway.errors import GatewayError
from letsinfer.gateway.policy import RoutingPolicy
from letsinfer.gateway.routing import Replica, RoutingTable

NOW = 1000.0
POLICY = RoutingPolicy(affinity_prefix_chars=64, affinity_min_chars=16, load_bound=1.25)


def replica(pg: str, in_flight: int = 0, capacity: int = 100, **facts: object) -> Replica:
    return Replica(pg, "m", f"http://{pg}", "", capacity, in_flight=in_flight, **facts)  # type: ignore[arg-type]


def take(replicas: list[Replica], hint: int | None, exclude: frozenset[str] = frozenset()) -> str:
    chosen = policy.choose(replicas, NOW, POLICY, hint, exclude)
    assert chosen is not None
    chosen.in_flight += 1
    return chosen.pg_id


def test_one_hot_prefix_sticks_to_one_replica_but_never_past_the_load_bound() -> None:
    replicas = [replica("a"), replica("b"), replica("c")]
    hot = policy.prefix_hash("You are a helpful assistant. " * 4, POLICY)
    assert hot is not None
    favourite = take(replicas, hot)
    placed = Counter({favourite: 1})
    for n in range(2, 151):  # nothing finishes: load only grows
        placed[take(replicas, hot)] += 1
        fair = n / len(replicas)
        assert max(r.in_flight for r in replicas) <= math.ceil(POLICY.load_bound * fair), n
    # The favourite holds its bounded share; the rest spill over, not to zero.
    assert placed[favourite] == max(placed.values())
    assert placed[favourite] <= math.ceil(1.25 * 150 / 3)
    assert all(placed[r.pg_id] > 0 for r in replicas)


def test_the_same_prefix_returns_to_the_same_replica_while_there_is_room() -> None:
    replicas = [replica("a"), replica("b"), replica("c"), replica("d")]
    prompts = [f"conversation {i}: " + "shared system prompt " * 3 for i in range(40)]
    first = {}
    for p in prompts:
        first[p] = take(replicas, policy.prefix_hash(p, POLICY))
        for r in replicas:  # each finishes before the next arrives
            r.in_flight = 0
    assert len(set(first.values())) == 4, "distinct prefixes spread over every replica"
    for p in prompts:
        assert take(replicas, policy.prefix_hash(p, POLICY)) == first[p]
        for r in replicas:
            r.in_flight = 0


def test_without_a_hint_the_least_loaded_replica_wins() -> None:
    a, b = replica("a", in_flight=3, capacity=4), replica("b", in_flight=3, capacity=8)
    assert policy.choose([a, b], NOW, POLICY) is b  # 3/8 busy beats 3/4
    short = policy.prefix_hash("hi", POLICY)
    assert short is None, "prompts under the minimum match carry no hint"


def test_fresh_facts_steer_the_choice_and_stale_ones_exclude() -> None:
    queued = replica("queued", queue_depth=50, facts_at=NOW - 1)
    hot = replica("hot", temperature_c=95.0, facts_at=NOW - 1)
    busy = replica("busy", slots_free=1, facts_at=NOW - 1)  # engine says 99 of 100 busy
    calm = replica("calm", in_flight=10, slots_free=90, temperature_c=60.0, facts_at=NOW - 1)
    assert policy.choose([queued, hot, busy, calm], NOW, POLICY) is calm

    stale = replica("stale", facts_at=NOW - POLICY.fact_max_age_s - 1)
    loaded = replica("loaded", in_flight=90)
    for _ in range(20):
        hint = policy.prefix_hash("a prompt that is long enough " * 2, POLICY)
        assert policy.choose([stale, loaded], NOW, POLICY, hint) is loaded
    assert policy.choose([stale], NOW, POLICY) is None


def test_affinity_only_chooses_among_the_replicas_the_facts_allow() -> None:
    fresh = NOW - 1
    cool = replica("cool", slots_free=100, temperature_c=50.0, facts_at=fresh)
    hints = [
        policy.prefix_hash(f"conversation {i}: a system prompt long enough", POLICY)
        for i in range(200)
    ]
    # Hot, no free slot and a queue: not one hinted request, whatever its prefix.
    worst = replica("worst", temperature_c=99.0, queue_depth=40, slots_free=0, facts_at=fresh)
    # Each of the facts alone is enough to pass a replica over.
    hot = replica("hot", slots_free=100, temperature_c=95.0, facts_at=fresh)
    queued = replica("queued", slots_free=100, queue_depth=3, facts_at=fresh)
    no_slot = replica("no-slot", slots_free=0, facts_at=fresh)
    for bad in (worst, hot, queued, no_slot):
        placed: Counter[str] = Counter()
        for hint in hints:
            placed[take([bad, cool], hint)] += 1
            bad.in_flight = cool.in_flight = 0  # each finishes before the next
        assert placed == {"cool": 200}, bad.pg_id
    # When none is clear, affinity still chooses among them all: a prefix
    # sticks to one, and prefixes spread over both.
    other = replica("other", temperature_c=99.0, slots_free=100, facts_at=fresh)
    first = []
    for hint in hints:
        first.append(take([hot, other], hint))
        hot.in_flight = other.in_flight = 0
    assert set(first) == {"hot", "other"}
    for hint, was in zip(hints, first, strict=True):
        assert take([hot, other], hint) == was
        hot.in_flight = other.in_flight = 0


def test_paused_and_full_replicas_are_never_chosen() -> None:
    paused = replica("paused", paused=True)
    full = replica("full", in_flight=4, capacity=4)
    for i in range(50):
        hint = policy.prefix_hash(f"prompt number {i} with enough text", POLICY)
        assert policy.choose([paused, full], NOW, POLICY, hint) is None
    ok = replica("ok", in_flight=3, capacity=4)
    assert policy.choose([paused, full, ok], NOW, POLICY) is ok
    assert policy.choose([paused, full, ok], NOW, POLICY, exclude=frozenset({"ok"})) is None


def test_the_prompt_start_covers_messages_in_order_and_prompts() -> None:
    chat = protocol.parse(
        b'{"model": "m", "messages": [{"role": "system", "content": "Be brief."},'
        b'{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]}',
        protocol.CHAT,
    )
    assert protocol.prompt_start(chat, "chat", 100) == "system\nBe brief.\nuser\nHello\n"
    assert protocol.prompt_start(chat, "chat", 6) == "system"
    text = protocol.parse(b'{"model": "m", "prompt": ["Once upon"]}', protocol.COMPLETION)
    assert protocol.prompt_start(text, "completion", 100) == "Once upon"
    embed = protocol.parse(b'{"model": "m", "input": "x"}', protocol.EMBEDDING)
    assert protocol.prompt_start(embed, "embedding", 100) == ""


# -- admission ----------------------------------------------------------------


def admission(*replicas: Replica, waiting: int = 100, wait_s: float = 30) -> Admission:
    table = RoutingTable()
    for r in replicas:
        table.publish(r)
    return Admission(table, POLICY, AdmissionLimits(waiting, wait_s))


def test_waiters_are_served_round_robin_across_keys() -> None:
    async def scenario() -> list[str]:
        r = replica("a", capacity=1)
        adm = admission(r)
        await adm.acquire("m", "holder")
        served: list[str] = []

        async def wait(key: str) -> None:
            got = await adm.acquire("m", key)
            served.append(key)
            adm.release(got)

        # A busy key queues six requests before two other keys queue theirs.
        tasks = [asyncio.create_task(wait("busy")) for _ in range(6)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(wait(k)) for k in ("x", "y", "x")]
        await asyncio.sleep(0)
        assert adm.depth("m") == 9
        adm.release(r)  # the holder finishes; each served request frees the next
        await asyncio.gather(*tasks)
        assert r.in_flight == 0 and adm.depth() == 0
        return served

    served = asyncio.run(scenario())
    assert served[:5] == ["busy", "x", "y", "busy", "x"]
    assert Counter(served) == {"busy": 6, "x": 2, "y": 1}


def test_a_scrape_on_another_thread_reads_the_queue_while_it_changes() -> None:
    """The metrics scrape runs on the control thread while the gateway's loop
    queues and serves requests: it must read each model's depth, not walk the
    queues (a dict that changes size under iteration raises, failing the
    scrape just when requests wait)."""
    failures: list[BaseException] = []
    reads = 0
    stop = threading.Event()

    def scrape(adm: Admission) -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                assert 0 <= adm.depth("m") <= 400
            except BaseException as exc:
                failures.append(exc)
                return
            reads += 1

    async def scenario() -> None:
        r = replica("a", capacity=1)
        adm = admission(r, waiting=1000)
        await adm.acquire("m", "holder")

        async def churn(key: str) -> None:
            for _ in range(8):  # each key joins, is served, leaves, joins again
                adm.release(await adm.acquire("m", key))
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(churn(f"key-{i}")) for i in range(400)]
        await asyncio.sleep(0)
        assert adm.depth("m") == 400
        scraper = threading.Thread(target=scrape, args=(adm,), daemon=True)
        scraper.start()
        adm.release(r)
        await asyncio.gather(*tasks)
        stop.set()
        scraper.join(timeout=10)
        assert adm.depth("m") == adm.depth() == 0

    asyncio.run(scenario())
    assert not failures and reads > 0


def test_the_queue_is_bounded_in_size_and_time() -> None:
    async def scenario() -> tuple[GatewayError, GatewayError]:
        r = replica("a", capacity=1)
        adm = admission(r, waiting=1, wait_s=0.05)
        await adm.acquire("m", "k")
        first = asyncio.create_task(adm.acquire("m", "k"))
        await asyncio.sleep(0)
        with pytest.raises(GatewayError) as full:
            await adm.acquire("m", "k")
        with pytest.raises(GatewayError) as late:
            await first
        assert adm.depth() == 0 and r.in_flight == 1
        return full.value, late.value

    full, late = asyncio.run(scenario())
    assert (full.status, full.code) == (429, "queue_full") and full.headers["retry-after"]
    assert (late.status, late.code) == (429, "queue_timeout") and late.headers["retry-after"]


def test_a_waiter_that_left_in_the_turn_its_replica_went_does_not_strand_the_others() -> None:
    async def scenario() -> None:
        adm = admission(replica("a", capacity=1))
        await adm.acquire("m", "k")
        first, leaving, last = (asyncio.create_task(adm.acquire("m", "k")) for _ in range(3))
        await asyncio.sleep(0)
        leaving.cancel()  # its client went; its task has not run since
        adm.routing.withdraw("m", "a", "engine exited")  # in the same turn
        for waiter in (first, last):
            with pytest.raises(GatewayError) as gone:
                await waiter
            assert gone.value.status == 503 and "engine exited" in gone.value.message
        assert leaving.cancelled() and adm.depth() == 0

    asyncio.run(scenario())


def test_waiters_get_503_when_the_last_replica_goes_and_a_new_one_serves_them() -> None:
    async def scenario() -> None:
        r = replica("a", capacity=1)
        adm = admission(r)
        await adm.acquire("m", "k")
        doomed = asyncio.create_task(adm.acquire("m", "k"))
        await asyncio.sleep(0)
        adm.routing.withdraw("m", "a", "engine exited")
        with pytest.raises(GatewayError) as gone:
            await doomed
        assert gone.value.status == 503 and "engine exited" in gone.value.message
        with pytest.raises(GatewayError) as none:
            await adm.acquire("m", "k")
        assert none.value.status == 503

        adm.routing.publish(busy := replica("b", capacity=1))
        await adm.acquire("m", "k")
        waiting = asyncio.create_task(adm.acquire("m", "k"))
        await asyncio.sleep(0)
        adm.routing.publish(fresh := replica("c", capacity=1))  # new capacity: served at once
        assert (await waiting) is fresh
        assert busy.in_flight == 1 and fresh.in_flight == 1

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_no_trace_even_when_a_slot_was_on_its_way() -> None:
    async def scenario() -> None:
        r = replica("a", capacity=1)
        adm = admission(r)
        await adm.acquire("m", "k")
        gone = asyncio.create_task(adm.acquire("m", "k"))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert adm.depth() == 0

        late = asyncio.create_task(adm.acquire("m", "k"))
        await asyncio.sleep(0)
        adm.release(r)  # hands the slot to `late` ...
        late.cancel()  # ... which is cancelled before it runs: the slot must come back
        with pytest.raises(asyncio.CancelledError):
            await late
        assert r.in_flight == 0 and adm.depth() == 0

    asyncio.run(scenario())


def test_a_waiter_cancelled_in_the_turn_a_slot_frees_does_not_take_the_slot_for_good() -> None:
    async def scenario() -> None:
        r = replica("a", capacity=1)
        adm = admission(r)
        held = await adm.acquire("m", "holder")
        gone = asyncio.create_task(adm.acquire("m", "k"))
        await asyncio.sleep(0)
        # One turn of the loop: the waiting client's connection drops (its
        # task is cancelled, not yet run), then the holder finishes.
        gone.cancel()
        adm.release(held)
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert r.in_flight == 0 and adm.depth() == 0
        again = await asyncio.wait_for(adm.acquire("m", "k"), 1)  # the slot is free
        assert again is r

    asyncio.run(scenario())


def test_a_waiter_takes_a_free_slot_that_those_ahead_of_it_cannot_use() -> None:
    async def scenario() -> None:
        tuned = replica("a", capacity=1, adapters=("x",))
        plain = replica("b", capacity=4)
        adm = admission(tuned, plain, wait_s=5)
        await adm.acquire("m", "k1", adapter="x")  # the only group with the adapter: full
        ahead = asyncio.create_task(adm.acquire("m", "k2", adapter="x"))
        await asyncio.sleep(0)
        assert adm.depth("m") == 1
        # The base model waits behind it, with four free slots on "b".
        got = await asyncio.wait_for(adm.acquire("m", "k3"), 1)
        assert got is plain and plain.in_flight == 1
        assert adm.depth("m") == 1 and not ahead.done()  # still waits for its adapter
        ahead.cancel()

    asyncio.run(scenario())


def test_a_higher_band_keeps_a_free_slot_its_key_can_use_behind_an_adapter_request() -> None:
    async def scenario() -> None:
        plain = replica("a", capacity=1)
        tuned = replica("b", capacity=1, adapters=("x",))
        adm = admission(plain, tuned, wait_s=5)
        held = [await adm.acquire("m", "holder"), await adm.acquire("m", "holder")]
        waits = [
            asyncio.create_task(adm.acquire("m", "human", band=0, adapter="x")),
            asyncio.create_task(adm.acquire("m", "human", band=0)),
            asyncio.create_task(adm.acquire("m", "crawler", band=2)),
        ]
        await asyncio.sleep(0)
        assert adm.depth("m") == 3
        adm.release(plain if held[0] is plain else held[1])  # a slot the adapter cannot use
        got = await asyncio.wait_for(waits[1], 1)
        assert got is plain, "the interactive key's base request, not the batch key's"
        assert not waits[0].done() and not waits[2].done()
        adm.release(tuned)  # now the adapter's group: the first in line for it
        assert await asyncio.wait_for(waits[0], 1) is tuned
        for task in waits:
            task.cancel()

    asyncio.run(scenario())


def test_under_steady_interactive_load_every_band_still_moves() -> None:
    """Interactive requests keep coming, always some waiting: standard and batch
    waiters still get a slot within a bounded number of admissions, and
    interactive goes first until then."""

    async def scenario() -> list[str]:
        r = replica("a", capacity=1)
        adm = admission(r)
        slot = await adm.acquire("m", "holder")
        waiting: dict[asyncio.Task[Replica], str] = {}

        def wait(key: str, band: int) -> None:
            waiting[asyncio.create_task(adm.acquire("m", key, band=band))] = key

        wait("crawler", 2)
        wait("office", 1)
        for _ in range(3):
            wait("human", 0)
        await asyncio.sleep(0)
        assert adm.depth("m") == 5
        admitted: list[str] = []
        while "crawler" not in admitted and len(admitted) < 100:
            adm.release(slot)  # the one at the engine finishes: the next is admitted
            done, _ = await asyncio.wait(
                set(waiting), timeout=1, return_when=asyncio.FIRST_COMPLETED
            )
            [task] = done
            admitted.append(waiting.pop(task))
            slot = task.result()
            if admitted[-1] == "human":
                wait("human", 0)  # the interactive load never lets up
                await asyncio.sleep(0)
        for task in waiting:
            task.cancel()
        return admitted

    admitted = asyncio.run(scenario())
    assert "crawler" in admitted, "the batch request waited through 100 admissions"
    # Eight in a row for interactive (band_aging), then the standard and the
    # batch request, each passed over that many times.
    assert admitted == ["human"] * 8 + ["office", "crawler"], admitted


def test_per_key_concurrency_is_counted_and_refused_over_the_limit() -> None:
    adm = admission(replica("a"))
    adm.enter_key("k", 2)
    adm.enter_key("k", 2)
    with pytest.raises(GatewayError) as over:
        adm.enter_key("k", 2)
    assert over.value.status == 429 and over.value.code == "concurrency_limit_exceeded"
    assert adm.key_in_flight("k") == 2
    adm.leave_key("k")
    adm.enter_key("k", 2)
    adm.enter_key("unlimited", None)
    assert adm.key_in_flight("k") == 2 and adm.key_in_flight("unlimited") == 1


def test_a_groups_facts_are_its_own_gpus_its_head_engine_and_its_stalest_node() -> None:
    def view(node: str, received: float, temps: dict[str, int], *pfs: PlacementFact) -> NodeView:
        gpus = [
            GpuFact(uuid=u, name="g", memory_total=1, memory_free=1, temperature_c=t)
            for u, t in temps.items()
        ]
        facts = Facts(
            node_id=node,
            seq=1,
            ts=2e9,
            cpus=1,
            memory_bytes=1,
            targets=["cuda"],
            gpus=gpus,
            placements=list(pfs),
            version="x",
        )
        return NodeView(facts, received)

    head = PlacementFact(pg_id="pg", task="0", state="ready", slots_free=1, queue_depth=3)
    other = PlacementFact(pg_id="pg", task="1", state="ready", slots_free=0, queue_depth=9)
    views = {
        "a": view("a", NOW - 1, {"GPU-a0": 70, "GPU-a1": 99}, head),  # a1 is another group's
        "b": view("b", NOW - 4, {"GPU-b0": 85}, other),
    }
    tasks = [("0", "a", ["GPU-a0"]), ("1", "b", ["GPU-b0"])]
    facts = group_facts("pg", tasks, views)
    assert facts is not None
    assert (facts.temperature_c, facts.slots_free, facts.queue_depth) == (85.0, 1, 3)
    assert facts.at == NOW - 4, "as fresh as its stalest node"
    assert group_facts("pg", [*tasks, ("2", "c", [])], views) is None, "c has sent no facts"

    table = RoutingTable()
    table.publish(r := replica("pg"))
    table.observe("m", "pg", facts)
    assert (r.temperature_c, r.queue_depth, r.facts_at) == (85.0, 3, NOW - 4)
    assert policy.usable(r, NOW, POLICY)
    assert not policy.usable(r, NOW - 4 + POLICY.fact_max_age_s + 1, POLICY)
