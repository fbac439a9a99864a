"""Denials are bounded: refusals are counted per source, action and reason and
written as a few records with counts, whatever the rate (a real store, a
clock the test moves)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.audit.chain import verify_chain
from letsinfer.audit.denials import MAX_KINDS, OTHER_SOURCES, DenialLog, record_denial
from letsinfer.authority.audit_echo import line
from letsinfer.authority.facts import FactLedger
from letsinfer.contracts.facts import Facts
from letsinfer.control.facts_route import PATH, FactsRoute
from letsinfer.store import AuthorityStore
from letsinfer.trust import pki
from letsinfer.trust.peer import Peer


def denied(store: AuthorityStore) -> list[tuple[str, str, int | None]]:
    return [(r.actor, str(r.detail), r.count) for r in store.list_audit() if r.outcome == "denied"]


def test_a_flood_becomes_one_record_per_interval_with_counts_that_add_up(tmp_path: Path) -> None:
    store = AuthorityStore(tmp_path / "authority.db")
    clock = [1000.0]
    log = DenialLog(store, interval_s=60, clock=lambda: clock[0])

    log.note("client:10.0.0.9", "gateway.request", "invalid_api_key")
    log.flush()  # the first refusal is written at once
    assert denied(store) == [("client:10.0.0.9", "invalid_api_key", 1)]

    for second in range(1, 150):  # 100 refusals a second for 150 s, written each second
        clock[0] = 1000.0 + second
        for _ in range(100):
            log.note("client:10.0.0.9", "gateway.request", "invalid_api_key")
        log.flush()
    clock[0] += 60  # the flood is over; its last window ends, then an empty one
    log.flush()
    clock[0] += 60
    log.flush()

    records = denied(store)
    assert len(records) <= 4, records  # one at once, then one per 60 s interval
    assert sum(n or 0 for _, _, n in records) == 1 + 149 * 100
    assert verify_chain(store.list_audit()) is None

    # A new refusal after a quiet interval is written at once again.
    log.note("client:10.0.0.9", "gateway.request", "invalid_api_key")
    log.flush()
    assert denied(store)[-1] == ("client:10.0.0.9", "invalid_api_key", 1)
    store.close()


def test_sources_and_reasons_are_kept_apart_and_their_number_is_capped(tmp_path: Path) -> None:
    store = AuthorityStore(tmp_path / "authority.db")
    log = DenialLog(store, interval_s=60)
    log.note("tls:10.0.0.1", "control:handshake", "bad CA")
    log.note("tls:10.0.0.2", "control:handshake", "bad CA")
    log.note("tls:10.0.0.1", "control:handshake", "refused ours")
    for i in range(MAX_KINDS * 3):  # spoofed sources: counted together past the cap
        log.note(f"client:10.1.{i // 256}.{i % 256}", "gateway.request", "invalid_api_key")
    log.flush()
    records = denied(store)
    assert len(records) <= MAX_KINDS + 1
    assert sum(n or 0 for _, _, n in records) == 3 + MAX_KINDS * 3
    assert any(actor == OTHER_SOURCES for actor, _, _ in records)
    assert {(a, d) for a, d, _ in records} >= {
        ("tls:10.0.0.1", "bad CA"),
        ("tls:10.0.0.2", "bad CA"),
        ("tls:10.0.0.1", "refused ours"),
    }
    store.close()


def test_short_lived_processes_aggregate_through_the_store(tmp_path: Path) -> None:
    # Each call opens the store as a new CLI process would.
    for _ in range(30):
        store = AuthorityStore(tmp_path / "authority.db")
        record_denial(store, "cli:alice", "cli:model list", "runs on main only", 60)
        store.close()
    store = AuthorityStore(tmp_path / "authority.db")
    assert denied(store) == [("cli:alice", "runs on main only", 1)]
    store.close_denial_windows(now=10**10, interval_s=60)  # the window ends
    assert denied(store) == [
        ("cli:alice", "runs on main only", 1),
        ("cli:alice", "runs on main only", 29),
    ]
    store.close()


# -- refused facts: a peer's text, bounded --------------------------------------


class _Reports:
    """The main's report intake, reduced to the ledger's real checks."""

    def __init__(self) -> None:
        self.ledger = FactLedger()

    def admit(self) -> None:
        return None

    async def report(
        self, peer: Peer, der: bytes, envelope: dict[str, object]
    ) -> dict[str, object]:
        self.ledger.accept(peer, der, envelope)
        return {}


def _post(route: FactsRoute, peer: Peer, der: bytes, body: bytes) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "path": PATH,
        "method": "POST",
        "state": {"peer": peer},
        "extensions": {"tls": {"client_cert_der": der}},
    }
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    asyncio.run(route(scope, receive, send))
    return int(sent[0]["status"]), bytes(sent[1]["body"])  # type: ignore[call-overload]


def test_refused_facts_keep_a_peers_text_bounded_in_answers_audit_and_log(
    tmp_path: Path,
) -> None:
    """An enrolled node signs facts carrying unknown fields with huge, varied
    names: each answer, the audit record and its log line stay small, and the
    refusals are counted as one kind."""
    ca = pki.create_ca("cluster")
    key = pki.new_key()
    cert = pki.issue(
        ca[0], ca[1], key.public_key(), kind="node", subject_id="n1", role="child", days=1
    )
    der = cert.public_bytes(serialization.Encoding.DER)
    peer = Peer(identity=pki.identity_of(cert), address=None)
    store = AuthorityStore(tmp_path / "authority.db")
    log = DenialLog(store, interval_s=60)
    route = FactsRoute(
        None,  # type: ignore[arg-type]  # (only its own path is asked for)
        _Reports(),
        lambda p, reason: log.note(f"node:{p.identity.id}", "node.facts", reason),
        heartbeat_interval_s=1,
    )
    for i in range(20):
        facts = Facts(
            node_id="n1",
            seq=i + 1,
            ts=time.time(),
            cpus=1,
            memory_bytes=1,
            targets=["cpu"],
            version="x",
        ).model_dump(mode="json")
        facts[f"{i}" + "x" * 200_000] = 1  # signed by the node: only its content is refused
        body = json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()
        signature = base64.b64encode(key.sign(body, ec.ECDSA(hashes.SHA256()))).decode()
        envelope = json.dumps({"facts": body.decode(), "signature": signature}).encode()
        status, answer = _post(route, peer, der, envelope)
        assert status == 422 and len(answer) < 1000, (status, len(answer))
        assert "unknown field" in json.loads(answer)["error"]["message"]
    # An unknown field of the envelope itself, too.
    status, answer = _post(route, peer, der, json.dumps({"y" * 200_000: 1}).encode())
    assert status == 422 and len(answer) < 1000, (status, len(answer))

    log.flush()
    records = [r for r in store.list_audit() if r.action == "node.facts"]
    assert [(r.outcome, r.count) for r in records] == [("denied", 20)]
    assert records[0].detail == "facts out of bounds or malformed (facts: unknown field)"
    assert len(line(records[0])) < 300
    store.close()
