"""The main's facts batches beside a busy event loop.

    python -m benchmarks.facts_writes      # about 20 s

A main writes its nodes' facts in batches from its control thread while the
gateway's event loop runs in the same process. sqlite3 lets go of the GIL
around every statement it steps and must win it back, so when that loop is
busy each statement waits. This writes batches of 200 nodes' facts, alone
and beside a thread that keeps the GIL busy, with
:meth:`AuthorityStore.record_facts_batch` and with one UPDATE per node (what
it did before, kept here as the baseline), and prints nodes per second.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.busy import BusyThread
from letsinfer.store import AuthorityStore, FactsUpdate
from letsinfer.store.authority import Witness

NODES = 1000
BATCH = 200
FACTS = {
    "cpus": 8,
    "firewall": True,
    "gpus": [{"uuid": f"GPU-{k}", "memory_total": 80, "temperature_c": 50} for k in range(4)],
}

Write = Callable[[AuthorityStore, list[FactsUpdate]], None]


def one_statement_per_node(store: AuthorityStore, updates: list[FactsUpdate]) -> None:
    """The batch as it was written before: one UPDATE per node."""
    store.db.conn.executemany(
        "UPDATE nodes SET facts = ?, facts_at = ?, last_seen = ?, "
        "cert_fingerprint = COALESCE(?, cert_fingerprint), "
        "cert_not_after = COALESCE(?, cert_not_after), "
        "facts_seq = MAX(COALESCE(facts_seq, 0), ?), "
        "audit_head = CASE WHEN ? THEN ? ELSE audit_head END, "
        "audit_problem = CASE WHEN ? THEN ? ELSE audit_problem END "
        "WHERE id = ?",
        [
            (facts, at, at, fingerprint, not_after, seq, witnessed, head, witnessed, problem, node)
            for node, facts, at, fingerprint, not_after, seq, witnessed, head, problem in (
                u.row() for u in updates
            )
        ],
    )


def batched(store: AuthorityStore, updates: list[FactsUpdate]) -> None:
    store.record_facts_batch(updates, {})


def rate(write: Write, busy: bool, seconds: float) -> float:
    """Nodes' facts a second written by ``write`` in batches of ``BATCH``."""
    with tempfile.TemporaryDirectory() as tmp:
        store = AuthorityStore(Path(tmp) / "authority.db")
        with store.transaction():
            for i in range(NODES):
                store.add_node(f"n-{i}", f"c-{i}", "child", f"10.2.{i // 250}.{i % 250}:8444")
        written, seq = 0, 1
        spinning = BusyThread() if busy else contextlib.nullcontext()
        with spinning:
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                seq += 1
                updates = [
                    FactsUpdate(
                        f"n-{(written + j) % NODES}",
                        FACTS,
                        time.time(),
                        seq,
                        f"fp-{j}",
                        Witness({"count": seq}, None),
                        9e9,
                    )
                    for j in range(BATCH)
                ]
                with store.transaction():
                    write(store, updates)
                written += BATCH
            elapsed = time.perf_counter() - started
        store.close()
        return written / elapsed


def main() -> int:
    print(f"facts batches of {BATCH} nodes, nodes a second (1,000 nodes every 5 s: 200)")
    for busy in (False, True):
        ours, before = rate(batched, busy, 4.0), rate(one_statement_per_node, busy, 4.0)
        where = "beside a busy thread" if busy else "alone"
        print(f"  {where:<21} batched {ours:8,.0f}   one statement per node {before:8,.0f}"
              f"   ratio {ours / before:6.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
