"""The store's connection: plain sqlite3 for every query, sqlite_utils for its
insert helpers, imported at the first insert.

Most CLI calls only read the authority; importing sqlite_utils (with dateutil
and pluggy behind it) cost each of them about 50 ms, a fifth of a `letsinfer
model list`.
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any


def _import_sqlite_utils() -> Any:
    """sqlite_utils imports numpy when it can, only to store numpy values
    (never done here); numpy would cost every CLI call a tenth of a second.
    It is hidden during that one import, and importable again afterwards."""
    hidden = "numpy" not in sys.modules
    if hidden:
        sys.modules["numpy"] = None  # type: ignore[assignment]  # import fails: "not installed"
    try:
        import sqlite_utils
    finally:
        if hidden:
            del sys.modules["numpy"]
    return sqlite_utils


class Connection:
    """What the table mixins call ``self.db``: ``execute`` as sqlite_utils'
    Database has it, and ``db[table]`` for its Table (``insert``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        # As sqlite_utils' Database sets on the connections it wraps.
        conn.execute("PRAGMA recursive_triggers=on")
        self._database: Any = None

    def execute(self, sql: str, parameters: Any = None) -> sqlite3.Cursor:
        if parameters is None:
            return self.conn.execute(sql)
        return self.conn.execute(sql, parameters)

    def __getitem__(self, table: str) -> Any:
        if self._database is None:
            self._database = _import_sqlite_utils().Database(self.conn)
        return self._database[table]
