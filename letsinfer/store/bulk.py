"""Many rows in a few statements.

sqlite3 lets go of the GIL around every statement it steps (``executemany``:
around every row), and a thread that lets go of it must win it back. Beside
a busy event loop in the same process (the gateway under load) that costs up
to the interpreter's switch interval each time: milliseconds per row, and
the loop interrupted as often. So batches are written a few hundred rows
per statement.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

# Rows per statement: well under SQLite's least limit on bound parameters
# (32,766 since 3.32).
ROWS_PER_STATEMENT = 500


def insert_rows(
    conn: sqlite3.Connection,
    table: str,
    rows: Sequence[Sequence[Any]],
    columns: Sequence[str] = (),
) -> None:
    """``rows`` into ``table`` (into ``columns``, or every column in order)."""
    into = f"{table} ({', '.join(columns)})" if columns else table
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        part = rows[start : start + ROWS_PER_STATEMENT]
        marks = f"({', '.join('?' * len(part[0]))})"
        conn.execute(
            f"INSERT INTO {into} VALUES {', '.join([marks] * len(part))}",
            [value for row in part for value in row],
        )


def stage_rows(conn: sqlite3.Connection, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """``rows`` into a temporary table of this connection, made empty first
    (``table``: its name and columns, ``"name (a TEXT, b REAL)"``), for one
    statement to apply them all."""
    name = table.split("(", 1)[0].strip()
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {table}")
    conn.execute(f"DELETE FROM temp.{name}")
    insert_rows(conn, f"temp.{name}", rows)
