"""What a writer of the authority database can do to its audit chain (the
``letsinfer`` group may write the 0660 file; it cannot read the node key or
write under etc/)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from letsinfer.audit.chain import record_hash


def rewrite_audit_from(database: Path, seq: int, detail: str) -> None:
    """Edit record ``seq`` and recompute every hash after it, so that every
    link of the chain holds again."""
    db = sqlite3.connect(database)
    db.row_factory = sqlite3.Row
    with db:
        records = db.execute("SELECT * FROM audit WHERE seq >= ? ORDER BY seq", (seq,)).fetchall()
        prev = db.execute("SELECT hash FROM audit WHERE seq = ?", (seq - 1,)).fetchone()["hash"]
        for r in records:
            d = detail if r["seq"] == seq else r["detail"]
            h = record_hash(
                prev, r["seq"], r["ts"], r["actor"], r["role"], r["action"], r["target"],
                r["outcome"], d, r["count"],
            )  # fmt: skip
            db.execute(
                "UPDATE audit SET detail = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                (d, prev, h, r["seq"]),
            )
            prev = h
    db.close()


def cut_audit(database: Path, keep: int) -> list[tuple[object, ...]]:
    """Delete every record after ``keep``; return them (to put back)."""
    with sqlite3.connect(database) as db:
        gone = db.execute("SELECT * FROM audit WHERE seq > ? ORDER BY seq", (keep,)).fetchall()
        db.execute("DELETE FROM audit WHERE seq > ?", (keep,))
    return gone


def put_back(database: Path, records: list[tuple[object, ...]]) -> None:
    """Replace the records with these numbers by the given ones."""
    if not records:
        return
    with sqlite3.connect(database) as db:
        marks = ",".join("?" * len(records[0]))
        db.executemany("DELETE FROM audit WHERE seq = ?", [(r[0],) for r in records])
        db.executemany(f"INSERT INTO audit VALUES ({marks})", records)
