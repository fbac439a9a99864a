"""One main for many nodes: a report costs the same whatever the cluster's
size, reports are written in batches, an overloaded main sheds reports
instead of letting nodes go stale, and agents pace themselves.

The main's report path is driven in process here (its real desk, store,
writer and ledger, real certificates and signatures) so its reads can be
counted; the same path over mutual TLS, under overload and across a kill,
is tested on the namespace cluster in test_cluster_serving.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.agent.pacing import ReportPacing
from letsinfer.authority.factwriter import FactWriter
from letsinfer.authority.overload import AttentionClock, Shedder
from letsinfer.authority.reports import ReportDesk
from letsinfer.contracts.facts import Facts, GpuFact, PlacementFact, sign
from letsinfer.gateway.routing import RoutingTable
from letsinfer.store import AuthorityStore, TaskSpec
from letsinfer.telemetry.view import ClusterView
from letsinfer.trust import pki
from letsinfer.trust.peer import Peer

SECRET = b"s" * 32
GPUS = [
    GpuFact(uuid=f"GPU-{i}", name="Fake H100", memory_total=80 << 30, memory_free=80 << 30)
    for i in range(4)
]


@dataclass
class Reporter:
    id: str
    key: ec.EllipticCurvePrivateKey
    der: bytes
    peer: Peer

    def envelope(self, seq: int) -> dict[str, str]:
        facts = Facts(
            node_id=self.id,
            seq=seq,
            ts=time.time(),
            cpus=8,
            memory_bytes=64 << 30,
            targets=["cpu", "cuda"],
            version="test",
            gpus=GPUS,
            placements=[
                PlacementFact(
                    pg_id="pg-mine",
                    state="ready",
                    base_url="http://10.0.0.2:9000",
                    capacity=2,
                    slots_free=1,
                )
            ],
        )
        return sign(facts, self.key)


def _cluster(tmp: Path, others: int) -> tuple[AuthorityStore, Reporter]:
    """A main, the reporting child with one group, and ``others`` more
    children, each with its facts and a group; some in parallel groups with
    recorded links, some removed (their certificates revoked)."""
    store = AuthorityStore(tmp / "authority.db")
    ca_key, ca_cert = pki.create_ca("cluster")
    key = pki.new_key()
    cert = pki.issue(
        ca_key, ca_cert, key.public_key(), kind="node", subject_id="n-me", role="child", days=3
    )
    der = pki.cert_pem(cert)
    ident = pki.identity_of(cert)
    store.ensure_release("rel", "llama-server", "1", "cpu", {}, {"binary": "x"})
    store.add_service("chat", "0" * 64, 1, "gguf", None)
    facts = {"cpus": 8, "gpus": [g.model_dump() for g in GPUS], "firewall": True}
    with store.transaction():
        store.add_node("n-main", "main", "main", "10.0.0.1")
        store.add_node("n-me", "me", "child", "10.0.0.2:8444", ident.fingerprint)
        for i in range(others):
            store.add_node(f"n-{i}", f"child-{i}", "child", f"10.1.{i // 250}.{i % 250}:8444")
            store.record_node_facts(f"n-{i}", facts, f"fp-{i}", seq=1)
    store.add_placement_group("pg-mine", "chat", "n-me", "rel", "cpu", ("GPU-0",))
    for i in range(others):
        store.add_placement_group(f"pg-{i}", "chat", f"n-{i}", "rel", "cpu", (f"GPU-{i}-a",))
    for i in range(0, others - 1, 20):
        a, b = f"n-{i}", f"n-{i + 1}"
        store.add_parallel_placement_group(
            f"pg-wide-{i}",
            "chat",
            "rel",
            "cpu",
            [TaskSpec("0", a, "10.2.0.1", 20000), TaskSpec("1", b, "10.2.0.2", 20000)],
        )
        store.set_link_state(a, b, "proven")
    for i in range(0, others, 30):
        store.remove_node(f"n-{i}")
    peer = Peer(identity=ident, address="10.0.0.2")
    return store, Reporter("n-me", key, der_of(der), peer)


def der_of(pem: bytes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return pki.load_cert(pem).public_bytes(serialization.Encoding.DER)


def _desk(store: AuthorityStore, batch_s: float) -> tuple[ReportDesk, RoutingTable]:
    """The main's report desk on ``store``, its routing changes applied at once."""
    clock = AttentionClock()
    view = ClusterView(store, min_interval_s=0.0)
    view.load()
    routing = RoutingTable(clock=clock.now)
    desk = ReportDesk(
        store,
        FactWriter(store, batch_s),
        routing,
        lambda change: change(),
        view,
        SECRET,
        clock,
        heartbeat_interval_s=5.0,
        stale_after_s=20.0,
        proof_ttl_s=30.0,
    )
    return desk, routing


async def _reads(store: AuthorityStore, me: Reporter) -> tuple[list[tuple[int, int]], int, bool]:
    """(queries, rows) each of three reports cost, the rows a quiet background
    round read, and whether the reporter's group got published."""
    desk, routing = _desk(store, 0.001)
    desk.round()
    costs = []
    for seq in (1, 2, 3):
        queries, rows = store.queries, store.rows_read
        answer = await desk.report(me.peer, me.der, me.envelope(seq))
        costs.append((store.queries - queries, store.rows_read - rows))
        assert [p["pg_id"] for p in answer["placements"]] == ["pg-mine"]  # type: ignore[index]
    desk.round()  # takes in what the reports changed (the group's state)
    rows = store.rows_read
    desk.round()
    quiet_round = store.rows_read - rows
    published = any(r.pg_id == "pg-mine" for r in routing.replicas("chat"))
    return costs, quiet_round, published


def test_a_report_reads_no_more_rows_with_hundreds_of_nodes_than_with_one(
    tmp_path: Path,
) -> None:
    small, me = _cluster(tmp_path / "one", others=0)
    big, me_big = _cluster(tmp_path / "many", others=300)
    assert len(big.list_nodes(include_removed=True)) == 302
    alone, alone_round, alone_published = asyncio.run(_reads(small, me))
    many, many_round, many_published = asyncio.run(_reads(big, me_big))
    assert alone_published and many_published, "the report did its work in both"
    assert many == alone, f"per report (queries, rows): {many} with 300 nodes, {alone} with one"
    assert many_round <= alone_round, (many_round, alone_round)
    # and the facts are on disk, with their sequence (replays refused after a restart)
    node = big.get_node("n-me")
    assert node is not None and node.facts_seq == 3 and node.facts is not None
    assert len(node.facts["gpus"]) == 4


def test_a_group_is_routed_only_once_the_authority_says_it_is_ready(tmp_path: Path) -> None:
    """Facts are written in batches: the gateway gets a child's ready group
    when its batch is on disk, so `model show` never says "starting" for a
    group the gateway already serves."""
    store, me = _cluster(tmp_path, others=0)

    async def scenario() -> tuple[bool, str | None, bool, str | None]:
        desk, routing = _desk(store, 30.0)  # the batch is written when the test says
        desk.round()
        report = asyncio.create_task(desk.report(me.peer, me.der, me.envelope(1)))
        await asyncio.sleep(0.05)  # taken, its batch not written yet
        before = any(r.pg_id == "pg-mine" for r in routing.replicas("chat"))
        stored_before = store.get_placement_group("pg-mine")
        desk.writer.flush()  # as the batch's timer would
        await report
        after = any(r.pg_id == "pg-mine" for r in routing.replicas("chat"))
        stored = store.get_placement_group("pg-mine")
        return (
            before,
            stored_before.state if stored_before else None,
            after,
            stored.state if stored else None,
        )

    before, state_before, after, state = asyncio.run(scenario())
    assert (before, state_before) == (False, "pending"), "neither routed nor recorded yet"
    assert (after, state) == (True, "ready")


def test_reports_in_one_interval_are_written_in_one_transaction(tmp_path: Path) -> None:
    store, _ = _cluster(tmp_path, others=50)
    writer = FactWriter(store, 0.05)
    from letsinfer.store import FactsUpdate

    async def burst() -> None:
        done = [
            writer.facts(FactsUpdate(f"n-{i}", {"cpus": 1}, time.time(), 10 + i))
            for i in range(1, 50)
        ]
        writer.heard("n-me")
        assert writer.backlog == 49 and writer.batches == 0
        await asyncio.gather(*done)

    asyncio.run(burst())
    assert writer.batches == 1 and writer.rows == 49
    assert store.get_node("n-7") is not None and store.get_node("n-7").facts_seq == 17  # type: ignore[union-attr]
    me = store.get_node("n-me")
    assert me is not None and me.last_seen is not None and me.facts_seq is None


# -- overload: the shedding decision and the clock it stops ----------------------
class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_attention_clock_stands_still_while_the_main_sheds() -> None:
    mono = FakeClock()
    clock = AttentionClock(mono)
    start = clock.now()
    mono.t += 5
    assert clock.now() - start == 5
    clock.hold(mono.t + 10)  # shedding from now, and 10 s past it
    mono.t += 8
    assert clock.now() - start == 5 and clock.held
    clock.hold(mono.t + 10)  # still shedding: the hold reaches further
    mono.t += 30
    assert clock.now() - start == 5 + 30 - 10 and not clock.held
    clock.hold(mono.t + 1)  # a new spell later
    mono.t += 3
    assert clock.now() - start == 25 + 2
    # Displays read when a node was last heard on the wall clock: the silence
    # that counts as 3 s (or 25 s) here leaves out the seconds the main stood still.
    assert clock.window(3) == 3 + 1
    assert clock.window(25) == 25 + 1 + 18
    assert clock.window(1) == 1, "the last second the clock ran"


def test_a_lagging_loop_sheds_a_growing_share_and_recovers() -> None:
    mono = FakeClock()
    clock = AttentionClock(mono)
    draws = iter([0.5] * 10_000)
    shedder = Shedder(clock, retry_after_s=10, interval_s=5.0, rng=lambda: next(draws), mono=mono)
    assert shedder.admit() is None
    shedder.observe(0.01)
    assert not shedder.shedding
    for _ in range(3):
        shedder.observe(1.5)  # the loop wakes 1.5 s late
    assert shedder.share == 1.0 and shedder.admit() == 10 and clock.held
    while shedder.shedding:
        shedder.observe(0.0)
        mono.t += 0.1
    assert shedder.admit() is None
    assert shedder.shed == 1 and shedder.reports == 3
    # a backlog of reports waiting for the disk sheds too
    assert shedder.admit(backlog=shedder.max_backlog + 1) is None or shedder.shedding
    assert shedder.share > 0


# -- agents pace themselves --------------------------------------------------------
def test_agents_back_off_with_jitter_on_timeouts_and_refusals_alike() -> None:
    low = ReportPacing(5.0, rng=lambda: 0.0)
    high = ReportPacing(5.0, rng=lambda: 1.0)
    assert low.answered() == high.answered() == 5.0
    assert low.busy(10) == 10.0 and high.busy(10) == 15.0, "Retry-After, spread by up to half"
    assert low.busy(None) == 5.0 and low.busy(1) == 5.0, "never sooner than the interval"
    waits = [high.failed() for _ in range(5)]
    assert waits == [10.0, 15.0, 15.0, 15.0, 15.0], "doubling, up to three intervals"
    assert [low.failed() for _ in range(3)] == [5.0] * 3, "drawn between the interval and it"
    assert high.answered() == 5.0 and high.failures == 0
    assert high.refused() == 100.0


@pytest.mark.parametrize("header", ["soon", "-1", "99999"])
def test_a_nonsense_retry_after_is_ignored(header: str) -> None:
    import httpx

    from letsinfer.agent.pacing import retry_after

    assert retry_after(httpx.Response(503, headers={"retry-after": header})) is None
    assert retry_after(httpx.Response(503, headers={"retry-after": "12"})) == 12.0


# -- cheap reports: one connection kept, TLS sessions resumed ------------------------
def test_an_agent_keeps_its_connection_and_resumes_its_tls_session(tmp_path: Path) -> None:
    from letsinfer.agent.pacing import keepalive_s
    from letsinfer.connections import control_limits
    from letsinfer.planes import RunningPlane, tls_server
    from letsinfer.trust.client import ClusterClient
    from letsinfer.trust.material import TlsFiles
    from letsinfer.trust.peer import presenting_server

    ca_key, ca_cert = pki.create_ca("cluster")
    pki.write_pem(tmp_path / "ca.crt", pki.cert_pem(ca_cert))
    for name, role in (("main", "main"), ("node", "child")):
        key = pki.new_key()
        cert = pki.issue(
            ca_key, ca_cert, key.public_key(), kind="node", subject_id=name, role=role, days=3
        )
        pki.write_pem(tmp_path / f"{name}.crt", pki.cert_pem(cert))
        pki.write_private_key(tmp_path / f"{name}.key", key)
    files = TlsFiles(tmp_path / "node.crt", tmp_path / "node.key", tmp_path / "ca.crt")

    async def ok(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"{}"})  # type: ignore[operator]

    async def scenario() -> tuple[int, int, int, int]:
        limits = control_limits(4096, 64, 5.0, 20_000)
        tls = presenting_server(tmp_path / "main.crt", tmp_path / "main.key", tmp_path / "ca.crt")
        server = tls_server(ok, "127.0.0.1", 0, tls, name="control plane", limits=limits)
        plane = RunningPlane(server)
        await plane.start()
        listener = server.listener
        assert listener is not None
        url = f"https://127.0.0.1:{server.port}/v1/agent/facts"
        try:
            kept = ClusterClient(files, expect_node="main", keepalive_s=keepalive_s(5.0))
            for _ in range(3):
                assert (await kept.arequest("POST", url, json={})).status_code == 200
            one = (listener.handshakes, listener.resumed)
            await kept.aclose()  # its connection is gone (the main restarted, say)
            assert (await kept.arequest("POST", url, json={})).status_code == 200
            await kept.aclose()
            fresh = ClusterClient(files, expect_node="main")  # a connection per call
            for _ in range(3):
                assert (await fresh.arequest("POST", url, json={})).status_code == 200
            return (*one, listener.handshakes, listener.resumed)
        finally:
            await plane.stop()

    kept_handshakes, kept_resumed, handshakes, resumed = asyncio.run(scenario())
    assert (kept_handshakes, kept_resumed) == (1, 0), "three reports over one connection"
    # The reconnection resumed; so did each of the fresh client's after its first.
    assert (handshakes, resumed) == (5, 3)
    # The main keeps an idle connection longer than an agent does, at any heartbeat.
    for interval in (0.5, 5.0, 60.0):
        assert control_limits(4096, 64, interval, 20_000).idle_timeout_s > keepalive_s(interval)


def test_a_batch_writes_each_nodes_facts_as_its_own_update_would(tmp_path: Path) -> None:
    from letsinfer.store import FactsUpdate
    from letsinfer.store.authority import Witness

    store = AuthorityStore(tmp_path / "authority.db")
    with store.transaction():
        for n in ("a", "b", "c", "d"):
            store.add_node(f"n-{n}", n, "child", f"10.0.0.{ord(n)}:8444", f"fp-{n}")
    head = {"count": 3, "last": "ab" * 32}
    with store.transaction():  # the first reports
        store.record_facts_batch(
            [
                FactsUpdate("n-a", {"cpus": 1}, 100.0, 5, "fp-a2", Witness(head, None), 900.0),
                FactsUpdate("n-b", {"cpus": 2}, 100.0, 50, "fp-b2", Witness(head, "cut"), 900.0),
            ],
            {"n-d": 500.0},
        )
    with store.transaction():  # and the next batch
        store.record_facts_batch(
            [
                # an older sequence (kept at 50), no certificate seen, no witness: kept
                FactsUpdate("n-b", {"cpus": 4}, 200.0, 7),
                # a node the main does not know: nothing written for it
                FactsUpdate("n-gone", {"cpus": 9}, 200.0, 1),
            ],
            {"n-c": 300.0, "n-d": 400.0},  # d was heard later before: its last_seen stays
        )
    a, b, c, d = (store.get_node(f"n-{n}") for n in "abcd")
    assert a is not None and b is not None and c is not None and d is not None
    assert (a.facts, a.facts_seq, a.last_seen, a.cert_not_after) == ({"cpus": 1}, 5, 100.0, 900.0)
    assert (a.audit_head, a.audit_problem, a.cert_fingerprint) == (head, None, "fp-a2")
    assert (b.facts, b.facts_seq, b.last_seen) == ({"cpus": 4}, 50, 200.0)
    assert (b.cert_not_after, b.audit_head, b.audit_problem) == (900.0, head, "cut")
    assert b.cert_fingerprint == "fp-b2"
    assert c.last_seen == 300.0 and c.facts_seq is None
    assert d.last_seen == 500.0
    assert store.get_node("n-gone") is None


def test_a_thousand_nodes_facts_are_a_few_statements(tmp_path: Path) -> None:
    # One statement per node made the control thread win the GIL back from the
    # gateway's busy loop once per node (letsinfer/store/bulk.py).
    from letsinfer.store import FactsUpdate

    store = AuthorityStore(tmp_path / "authority.db")
    with store.transaction():
        for i in range(1000):
            store.add_node(f"n-{i}", f"c-{i}", "child", f"10.2.{i // 250}.{i % 250}:8444")
    statements: list[str] = []
    store.db.conn.set_trace_callback(statements.append)
    with store.transaction():
        store.record_facts_batch(
            [FactsUpdate(f"n-{i}", {"cpus": i}, 100.0, i) for i in range(1000)],
            {f"n-{i}": 50.0 for i in range(1000, 1010)},
        )
    store.db.conn.set_trace_callback(None)
    # (SQLite reports a statement again at each row's trigger: count each once.)
    assert len({s for s in statements if s.startswith(("INSERT", "UPDATE"))}) <= 5
    node = store.get_node("n-777")
    assert node is not None and node.facts == {"cpus": 777} and node.facts_seq == 777
    # A batch of heard nodes only (the main shedding reports) touches no facts.
    statements.clear()
    store.db.conn.set_trace_callback(statements.append)
    with store.transaction():
        store.record_facts_batch([], {"n-1": 200.0})
    store.db.conn.set_trace_callback(None)
    assert not [s for s in statements if "facts" in s], statements
    node = store.get_node("n-1")
    assert node is not None and node.last_seen == 200.0 and node.facts == {"cpus": 1}
