"""Link proofs, the direct-route check, the main's link book, and the store of
parallel groups: unit level (the multi-node path is tests/test_parallel_cluster.py)."""

from __future__ import annotations

import re
import secrets
import sqlite3
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from pyroute2 import IPRoute

from letsinfer.authority.facts import FactLedger
from letsinfer.authority.links import LinkBook
from letsinfer.contracts.facts import FactError, Facts, LinkFact, sign
from letsinfer.links import proof
from letsinfer.links.route import Route, judge, require_direct
from letsinfer.store import AuthorityStore, StoreError, TaskSpec
from letsinfer.store.migrations import MIGRATIONS
from letsinfer.trust import pki
from letsinfer.trust.peer import Peer
from tests.netlab import NetLab, can_make_namespaces

CHALLENGE = "ab" * 32


# -- the signed challenge -----------------------------------------------------
def test_a_proof_verifies_only_for_the_same_nodes_address_challenge_and_key() -> None:
    key = pki.new_key()
    ts = time.time()
    sig = proof.sign(key, "node-a", "node-b", "10.0.0.2", CHALLENGE, ts)
    proof.verify(key.public_key(), sig, "node-a", "node-b", "10.0.0.2", CHALLENGE, ts)
    changed = [
        ("node-c", "node-b", "10.0.0.2", CHALLENGE, ts),  # another prober
        ("node-b", "node-a", "10.0.0.2", CHALLENGE, ts),  # the other direction
        ("node-a", "node-b", "10.0.0.9", CHALLENGE, ts),  # another address
        ("node-a", "node-b", "10.0.0.2", "cd" * 32, ts),  # another challenge
        ("node-a", "node-b", "10.0.0.2", CHALLENGE, ts + 1),  # another time
    ]
    for fields in changed:
        with pytest.raises(proof.LinkProofError, match="not signed by"):
            proof.verify(key.public_key(), sig, *fields)
    with pytest.raises(proof.LinkProofError, match="not signed by node-b's key"):
        proof.verify(pki.new_key().public_key(), sig, "node-a", "node-b", "10.0.0.2", CHALLENGE, ts)


def test_malformed_challenges_and_signatures_are_refused() -> None:
    key = pki.new_key()
    with pytest.raises(proof.LinkProofError, match="32 to 128 lowercase hex"):
        proof.sign(key, "a", "b", "10.0.0.2", "short", time.time())
    with pytest.raises(proof.LinkProofError, match="not base64"):
        proof.verify(key.public_key(), "%%%", "a", "b", "10.0.0.2", CHALLENGE, 1.0)


# -- the route check ----------------------------------------------------------
def test_only_an_on_link_unicast_route_is_direct() -> None:
    assert judge(Route("10.0.0.2", 1, None, "eth0", "10.0.0.1")) == "eth0"
    with pytest.raises(proof.LinkProofError, match=r"through gateway 10\.0\.0\.254"):
        judge(Route("10.9.0.2", 1, "10.0.0.254", "eth0", "10.0.0.1"))
    with pytest.raises(proof.LinkProofError, match="not a remote unicast address"):
        judge(Route("127.0.0.1", 2, None, "lo", "127.0.0.1"))


@pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")
def test_the_kernel_route_decides_direct_or_not() -> None:
    lab = NetLab(["a", "b"]).up()
    try:
        ns = lab.ns("a")
        assert require_direct(lab.hosts["b"], netns=ns) == "eth0"
        with IPRoute(netns=ns) as ipr:
            ipr.route("add", dst="10.99.0.0/24", gateway=lab.hosts["b"])
        with pytest.raises(proof.LinkProofError, match=re.escape(f"gateway {lab.hosts['b']}")):
            require_direct("10.99.0.5", netns=ns)
        with pytest.raises(proof.LinkProofError, match="no route"):
            require_direct("192.0.2.1", netns=ns)  # no default route in the namespace
    finally:
        lab.down()


# -- the main's checks --------------------------------------------------------
class Node:
    def __init__(self, ca: tuple[object, object], node_id: str) -> None:
        self.id = node_id
        self.key = pki.new_key()
        cert = pki.issue(
            ca[0],  # type: ignore[arg-type]
            ca[1],  # type: ignore[arg-type]
            self.key.public_key(),
            kind="node",
            subject_id=node_id,
            role="child",
            days=1,
        )
        self.der = cert.public_bytes(serialization.Encoding.DER)
        self.peer = Peer(identity=pki.identity_of(cert), address=None)
        self.seq = 0

    def facts(self, links: list[LinkFact] = (), seq: int | None = None) -> dict[str, str]:  # type: ignore[assignment]
        self.seq = seq if seq is not None else self.seq + 1
        body = Facts(
            node_id=self.id,
            seq=self.seq,
            ts=time.time(),
            cpus=1,
            memory_bytes=1,
            targets=["cpu"],
            links=list(links),
            version="x",
        )
        return sign(body, self.key)

    def proves(self, prober: Node, address: str, signer: object = None) -> LinkFact:
        """The proof ``prober`` holds of its link to this node."""
        challenge, ts = secrets.token_hex(32), time.time()
        key = signer or self.key
        sig = proof.sign(key, prober.id, self.id, address, challenge, ts)  # type: ignore[arg-type]
        return LinkFact(
            peer=self.id,
            address=address,
            proven_at=ts,
            challenge=challenge,
            signature=sig,
            interface="eth0",
        )


@pytest.fixture
def nodes() -> tuple[Node, Node]:
    ca = pki.create_ca("cluster")
    return Node(ca, "node-a"), Node(ca, "node-b")


def test_the_main_refuses_facts_with_a_forged_link_proof(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    ledger = FactLedger()
    ledger.accept(b.peer, b.der, b.facts())
    forged = b.proves(a, "10.0.0.2", signer=pki.new_key())
    with pytest.raises(FactError, match=r"refused link proof.*not signed by node-b's key"):
        ledger.accept(a.peer, a.der, a.facts([forged], seq=100))
    # Refused before its sequence counted: the real next facts still pass.
    ledger.accept(a.peer, a.der, a.facts([b.proves(a, "10.0.0.2")], seq=2))
    assert set(ledger.verified_links(a.id, 60, 30)) == {b.id}


def test_a_proof_counts_only_while_fresh_and_checkable(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    ledger = FactLedger()
    link = b.proves(a, "10.0.0.2")
    ledger.accept(a.peer, a.der, a.facts([link]))
    assert ledger.verified_links(a.id, 60, 30) == {}, "b's key is not known yet"
    ledger.accept(b.peer, b.der, b.facts())
    assert set(ledger.verified_links(a.id, 60, 30)) == {b.id}
    assert ledger.verified_links(a.id, 60, 30, now=time.time() + 60) == {}, "an old proof"


def _store_with_group(tmp: Path, a: Node, b: Node) -> AuthorityStore:
    store = AuthorityStore(tmp / "authority.db")
    store.add_node(a.id, "na", "child", "10.0.0.1:8444")
    store.add_node(b.id, "nb", "child", "10.0.0.2:8444")
    store.ensure_release("rel", "parallel-command", "1", "cpu", {}, {"binary": "x"})
    store.add_service("wide", "0" * 64, 1, "gguf", None)
    store.add_parallel_placement_group(
        "pg-wide",
        "wide",
        "rel",
        "cpu",
        [TaskSpec("0", a.id, "10.0.0.1", 20000), TaskSpec("1", b.id, "10.0.0.2", 20000)],
    )
    return store


def test_a_lost_link_pauses_its_group_until_resumed(
    tmp_path: Path, nodes: tuple[Node, Node]
) -> None:
    a, b = nodes
    store = _store_with_group(tmp_path, a, b)
    ledger = FactLedger()
    book = LinkBook(store, ledger, fresh_within_s=60, proof_ttl_s=30)

    ledger.accept(a.peer, a.der, a.facts())
    ledger.accept(b.peer, b.der, b.facts([a.proves(b, "10.0.0.1")]))
    assert book.reconcile() == [] and store.list_links() == [], "one direction is not a link"

    ledger.accept(a.peer, a.der, a.facts([b.proves(a, "10.0.0.2")]))
    assert book.reconcile() == []
    assert [(r.state) for r in store.list_links()] == ["proven"]
    assert book.is_proven(tuple(sorted((a.id, b.id))))  # type: ignore[arg-type]

    ledger.accept(a.peer, a.der, a.facts())  # a's proof of b is gone
    assert book.reconcile(may_lose=False) == [], "not judged while the main settles"
    assert book.reconcile() == ["pg-wide"]
    pg = store.get_placement_group("pg-wide")
    assert pg is not None and pg.paused_reason == "data link na–nb lost"

    ledger.accept(a.peer, a.der, a.facts([b.proves(a, "10.0.0.2")]))
    assert book.reconcile() == []
    assert [(r.state) for r in store.list_links()] == ["proven"]
    pg = store.get_placement_group("pg-wide")
    assert pg is not None and pg.paused_reason is not None, "a returning link does not resume"
    audit = [(r.action, r.target) for r in store.list_audit()]
    assert audit.count(("link.proven", "na–nb")) == 2
    assert ("link.lost", "na–nb") in audit and ("model.pause", "wide") in audit
    store.close()


# -- the store ----------------------------------------------------------------
def test_a_gpu_belongs_to_one_task_and_a_refused_group_leaves_nothing(
    tmp_path: Path, nodes: tuple[Node, Node]
) -> None:
    a, b = nodes
    store = _store_with_group(tmp_path, a, b)
    store.add_service("other", "1" * 64, 1, "gguf", None)
    with pytest.raises(StoreError, match="GPU GPU-x already belongs"):
        store.add_parallel_placement_group(
            "pg-bad",
            "other",
            "rel",
            "cuda",
            [
                TaskSpec("0", a.id, "10.0.0.1", 20001, ("GPU-x",)),
                TaskSpec("1", b.id, "10.0.0.2", 20001, ("GPU-x",)),
            ],
        )
    with pytest.raises(StoreError, match="conflicts"):  # port 20000 on node a is taken
        store.add_parallel_placement_group(
            "pg-bad",
            "other",
            "rel",
            "cpu",
            [TaskSpec("0", a.id, "10.0.0.1", 20000), TaskSpec("1", b.id, "10.0.0.2", 20001)],
        )
    assert store.get_placement_group("pg-bad") is None and store.pg_tasks("pg-bad") == []
    assert store.pg_gpus("pg-bad") == []
    assert [t.task for t in store.pg_tasks("pg-wide")] == ["0", "1"]
    store.close()


def test_migration_4_gives_every_existing_group_its_task_0(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:3]:
        conn.executescript(script)
    conn.execute("PRAGMA user_version = 3")
    conn.execute(
        "INSERT INTO nodes(id, name, role, state, paused, created_at) "
        "VALUES ('n', 'n', 'main', 'active', 0, 0)"
    )
    conn.execute(
        "INSERT INTO runtime_releases(id, engine, version, target, created_at) "
        "VALUES ('r', 'xllamacpp', '1', 'cpu', 0)"
    )
    conn.execute(
        "INSERT INTO model_services(name, artifact_digest, artifact_size, format, created_at) "
        "VALUES ('m', 'd', 1, 'gguf', 0)"
    )
    conn.execute(
        "INSERT INTO placement_groups(id, service, node_id, release_id, target, state, "
        "created_at, updated_at) VALUES ('pg-old', 'm', 'n', 'r', 'cpu', 'ready', 0, 0)"
    )
    conn.commit()
    conn.close()
    store = AuthorityStore(path)
    [task] = store.pg_tasks("pg-old")
    assert (task.task, task.node_id, task.port, task.state) == ("0", "n", None, "ready")
    assert store.tasks_on_node("n") == [task]
    store.close()


def test_a_replay_is_refused_after_a_restart_by_the_persisted_sequence(
    nodes: tuple[Node, Node],
) -> None:
    """A fresh ledger (a restarted main) knows no sequence of its own: the one
    the authority persisted refuses a replay of facts it had accepted before."""
    a, _ = nodes
    before = FactLedger()
    sent = a.facts(seq=41)
    before.accept(a.peer, a.der, sent)
    after = FactLedger()  # the main restarted
    with pytest.raises(FactError, match=r"replayed facts: sequence 41 after 41"):
        after.accept(a.peer, a.der, sent, persisted_seq=41)
    with pytest.raises(FactError, match=r"replayed facts: sequence 30 after 41"):
        after.accept(a.peer, a.der, a.facts(seq=30), persisted_seq=41)
    assert after.accept(a.peer, a.der, a.facts(seq=42), persisted_seq=41).seq == 42
    # Without the persisted sequence the same replay would pass: it is what holds.
    assert FactLedger().accept(a.peer, a.der, sent).seq == 41
