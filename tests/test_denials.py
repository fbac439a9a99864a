"""Denials are bounded: refusals are counted per source, action and reason and
written as a few records with counts, whatever the rate (a real store, a
clock the test moves)."""

from __future__ import annotations

from pathlib import Path

from letsinfer.authority.audit import verify_chain
from letsinfer.authority.denials import MAX_KINDS, OTHER_SOURCES, DenialLog, record_denial
from letsinfer.store import AuthorityStore


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
