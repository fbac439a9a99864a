"""The request-record writer: batched off the request path, bounded in memory,
records older than the kept days deleted, a broken disk never fatal."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from letsinfer.config import RequestSettings
from letsinfer.store.requests import RequestRecord, RequestStore
from letsinfer.usage.recorder import RequestLog

DAY = 86400.0
NOW = 2_000_000_000.0


def record(request_id: str, ts: float = NOW, key: str = "k", tokens: int = 1) -> RequestRecord:
    return RequestRecord(
        ts, request_id, key, "m", "pg-1", "n1", "chat", False, 200, tokens, tokens, 1.0, 2.0, 0.0
    )


def test_records_are_written_in_batches_and_old_ones_go(tmp_path: Path) -> None:
    path = tmp_path / "requests.db"
    old = RequestStore(path)
    old.insert_many([record("ancient", ts=NOW - 8 * DAY)])
    old.close()
    log = RequestLog(path, RequestSettings(keep_days=7), clock=lambda: NOW)
    for i in range(500):
        log.add(record(f"r{i}", key="a" if i % 2 else "b", tokens=i))

    async def run() -> None:
        await log.flush()
        await log.flush()  # nothing new: no write, no harm

    asyncio.run(run())
    store = RequestStore(path, readonly=True)
    assert store.find("ancient") == []
    assert store.find("r7") == [record("r7", key="a", tokens=7)]
    assert {u.name: (u.requests, u.prompt_tokens) for u in store.usage("key")} == {
        "a": (250, sum(range(1, 500, 2))),
        "b": (250, sum(range(0, 500, 2))),
    }
    assert store.usage("key", since=NOW + 1) == []


def test_a_records_file_from_before_the_cache_and_charges_gets_their_columns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "requests.db"
    columns = RequestRecord._fields[:-2]  # what a file of an earlier release has
    conn = sqlite3.connect(path)
    conn.execute(f"CREATE TABLE requests ({', '.join(columns)})")
    conn.execute(
        f"INSERT INTO requests VALUES ({', '.join('?' * len(columns))})", record("kept")[:-2]
    )
    conn.commit()
    conn.close()
    # `letsinfer request ID` before the upgraded gateway opened the file to write
    assert RequestStore(path, readonly=True).find("kept") == [record("kept")]
    store = RequestStore(path)
    cut = record("new")._replace(prompt_tokens=None, completion_tokens=None, charged=40)
    store.insert_many([cut])
    assert store.find("kept") == [record("kept")]  # nothing lost
    assert store.find("new") == [cut]
    # Limits count the charge; usage reports what the engines reported.
    spent, recent = store.key_usage({"k": NOW - 1}, NOW - 60)["k"]
    # Dated at arrival: opening the file does not index a file of that release.
    assert spent == 2 + 40 and sorted(recent) == [(NOW, NOW, 2, True), (NOW, NOW, 40, True)]
    assert [(u.prompt_tokens, u.completion_tokens) for u in store.usage("key")] == [(1, 1)]
    store.close()

    log = RequestLog(path, clock=lambda: NOW)
    asyncio.run(log.flush())  # the writer's first round, nothing to write: it indexes
    assert log._store is not None and log._store.dated_at_end
    spent, recent = log._store.key_usage({"k": NOW - 1}, NOW - 60)["k"]
    ended = NOW + 2.0 / 1000.0  # arrival plus its duration: when its tokens were charged
    assert spent == 2 + 40 and sorted(recent) == [(NOW, ended, 2, True), (NOW, ended, 40, True)]
    log._store.close()


def test_a_stuck_writer_holds_a_bounded_backlog_and_counts_what_it_drops(tmp_path: Path) -> None:
    (tmp_path / "requests.db").mkdir()  # a path no database can be opened at
    log = RequestLog(tmp_path / "requests.db", RequestSettings(max_pending=100))
    for i in range(150):
        log.add(record(f"r{i}"))
    assert log.dropped == 50

    asyncio.run(log.flush())  # fails, says so in the log, keeps what fits
    assert log.backlog == 100
    log.add(record("one more"))
    assert log.dropped == 51


def test_records_the_disk_could_not_take_count_once_for_limits(tmp_path: Path) -> None:
    """Limits are rebuilt from what the file holds and what waits for the disk:
    each record once, whether its write failed, or the delete of old records
    after it did."""
    log = RequestLog(tmp_path / "requests.db", clock=lambda: NOW)

    async def scenario() -> list[int]:
        await log.flush()  # the file is open
        store = log._store
        assert store is not None
        insert = store.insert_many

        def full(*args: object) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        spent = []
        store.insert_many = full  # type: ignore[method-assign]
        log.add(record("r1", tokens=2))  # 4 tokens
        await log.flush()
        assert log.backlog == 1
        spent.append((await log.usage_of({"k": 0.0}, NOW - 60))["k"][0])
        store.insert_many = insert  # type: ignore[method-assign]
        store.prune = full  # type: ignore[method-assign]  # ... and the delete after it fails
        log._pruned_at = 0.0
        log.add(record("r2", tokens=3))  # 6 more
        spent.append((await log.usage_of({"k": 0.0}, NOW - 60))["k"][0])
        assert log.backlog == 0
        return spent

    assert asyncio.run(scenario()) == [4, 10]
    assert len(RequestStore(tmp_path / "requests.db", readonly=True).find("r1")) == 1


def test_a_batch_is_written_in_a_few_statements_not_one_per_row(tmp_path: Path) -> None:
    # Each statement lets go of the GIL and must win it back from the gateway's
    # busy event loop: a statement per row kept the writer below a busy gateway's rate.
    store = RequestStore(tmp_path / "requests.db")
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    batch = [record(f"r{i}", tokens=i) for i in range(1200)]
    store.insert_many(batch)
    inserts = [s for s in statements if s.startswith("INSERT")]
    assert len(inserts) == 3  # 500 + 500 + 200 rows
    assert sorted(store.find(f"r{i}")[0] for i in range(1200)) == sorted(batch)
