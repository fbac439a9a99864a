"""Request records: what they cost the request path, and that their writes do
not slow the authority's.

    python -m benchmarks.records            # about 30 s
    python -m benchmarks.records --short

Three figures:

1. the request path's share: :meth:`RequestLog.add` per record (an append);
2. the writer: rows per second written in batches by its thread, alone and
   while another thread runs Python without pause (the gateway's event loop
   under load), against ``executemany`` (one statement per row, which lets go
   of the GIL around each row and must win it back from that thread);
3. the authority's write latency (one audit append per transaction, as the
   CLI and the node make them) while nothing else writes, while the records
   writer writes its own database at several times a busy gateway's rate,
   and, for contrast, while the same writer writes into the authority's own
   file (what a records table in the authority would do). Phases alternate
   A-B-C-A-B-C so the machine's drift hits all alike.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.busy import BusyThread
from letsinfer.config import RequestSettings
from letsinfer.store import AuthorityStore
from letsinfer.store.requests import RequestRecord, RequestStore
from letsinfer.usage.recorder import RequestLog


def record(i: int) -> RequestRecord:
    return RequestRecord(
        time.time(), f"req-{i:016x}", "bench", "mock", "pg-0", "node-0", "chat", True, 200,
        23, 14, 3.2, 321.0, 0.02,
    )  # fmt: skip


def add_cost(n: int) -> float:
    """Seconds per record on the request path: building it and RequestLog.add."""
    with tempfile.TemporaryDirectory() as tmp:
        log = RequestLog(Path(tmp) / "r.db", RequestSettings(max_pending=n + 1))
        now = time.time()
        started = time.perf_counter()
        for i in range(n):
            log.add(
                RequestRecord(
                    now,
                    "req",
                    "bench",
                    "mock",
                    "pg-0",
                    "node-0",
                    "chat",
                    True,
                    200,
                    23,
                    14,
                    3.2,
                    321.0,
                    i * 0.001,
                )
            )
        return (time.perf_counter() - started) / n


def writer_rate(rows: int, batch: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        store = RequestStore(Path(tmp) / "r.db")
        records = [record(i) for i in range(batch)]
        started = time.perf_counter()
        for _ in range(rows // batch):
            store.insert_many(records)
        store.close()
        return rows / (time.perf_counter() - started)


def writer_rate_beside_busy_thread(
    insert: Callable[[RequestStore, list[RequestRecord]], None], rows: int, batch: int
) -> tuple[float, float]:
    """Rows a second written by ``insert`` while a thread spins in Python, and
    that thread's laps a second."""
    with tempfile.TemporaryDirectory() as tmp:
        store = RequestStore(Path(tmp) / "r.db")
        records = [record(i) for i in range(batch)]
        with BusyThread() as busy:
            started = time.perf_counter()
            written = 0
            while written < rows and time.perf_counter() - started < 10:
                insert(store, records)
                written += batch
            elapsed = time.perf_counter() - started
        store.close()
        return written / elapsed, busy.pace


def _one_statement_per_row(store: RequestStore, records: list[RequestRecord]) -> None:
    columns = ", ".join(RequestRecord._fields)
    marks = ", ".join("?" * len(RequestRecord._fields))
    with store.conn:
        store.conn.executemany(f"INSERT INTO requests ({columns}) VALUES ({marks})", records)


class Writer:
    """A thread writing ``rate`` records a second in batches, like the recorder."""

    def __init__(self, insert: Callable[[list[RequestRecord]], None], rate: int) -> None:
        self.insert = insert
        self.rate = rate
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        interval = 0.2
        batch = [record(i) for i in range(int(self.rate * interval))]
        while not self.stop.is_set():
            self.insert(batch)
            self.stop.wait(interval)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def authority_latency(store: AuthorityStore, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        store.append_audit("bench", "bench.write", "ok", target=f"t{i}")
        out.append(time.perf_counter() - started)
        time.sleep(0.002)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true")
    parser.add_argument("--rate", type=int, default=5000, help="records a second while writing")
    args = parser.parse_args(argv)
    n = 200 if args.short else 600

    per_add = add_cost(100_000)
    print(f"request path: {per_add * 1e9:.0f} ns per record (built and handed to the log)")
    print(f"writer: {writer_rate(50_000, 1000):,.0f} rows/s in batches of 1000")
    ours, our_laps = writer_rate_beside_busy_thread(RequestStore.insert_many, 20_000, 1000)
    baseline, base_laps = writer_rate_beside_busy_thread(_one_statement_per_row, 2_000, 1000)
    print(
        f"writer beside a busy thread: {ours:,.0f} rows/s; executemany {baseline:,.0f} rows/s "
        f"({ours / baseline:.1f}x); the busy thread's pace {our_laps / base_laps:.2f}x"
    )

    with tempfile.TemporaryDirectory(prefix="letsinfer-bench-records-") as tmp:
        home = Path(tmp)
        authority = AuthorityStore(home / "authority.db")
        own = RequestStore(home / "requests.db")
        shared = sqlite3.connect(home / "authority.db", timeout=10.0, check_same_thread=False)
        shared.executescript(
            "CREATE TABLE IF NOT EXISTS bench_requests (ts REAL, request_id TEXT, key TEXT, "
            "model TEXT, pg TEXT, node TEXT, endpoint TEXT, stream INTEGER, status INTEGER, "
            "prompt_tokens INTEGER, completion_tokens INTEGER, ttft_ms REAL, duration_ms REAL, "
            "queue_ms REAL, cached INTEGER)"
        )

        def into_authority(batch: list[RequestRecord]) -> None:
            with shared:
                shared.executemany(
                    "INSERT INTO bench_requests VALUES "
                    f"({', '.join('?' * len(RequestRecord._fields))})",
                    batch,
                )

        phases: dict[str, list[float]] = {"idle": [], "own file": [], "authority file": []}
        for _ in range(2):
            phases["idle"] += authority_latency(authority, n)
            with Writer(own.insert_many, args.rate):
                phases["own file"] += authority_latency(authority, n)
            with Writer(into_authority, args.rate):
                phases["authority file"] += authority_latency(authority, n)
        authority.close()
        own.close()
        shared.close()

    print(f"\nauthority write latency, {2 * n} writes per phase, records at {args.rate}/s:")
    idle50 = statistics.median(phases["idle"])
    for name, values in phases.items():
        values.sort()
        p50, p99 = statistics.median(values), values[int(0.99 * len(values))]
        print(
            f"  {name:<15} p50 {p50 * 1000:7.3f} ms  p99 {p99 * 1000:7.3f} ms  "
            f"p50/idle {p50 / idle50:5.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
