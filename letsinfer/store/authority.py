"""The authority's SQLite store: its connection, transactions, migrations
and settings. Domain code calls its typed methods; those of each group of
tables live in a mixin of its own (nodes, controllers, releases, services,
groups, keys, adapters, scaling, webhooks, people, evals, audit), all inherited by
:class:`AuthorityStore`; the records they return are in records.py.

One connection per store object, used by one thread (a running main has two:
its gateway thread's and its control plane's, see letsinfer/control/thread.py),
WAL, a busy timeout, explicit ``BEGIN IMMEDIATE`` transactions so that a
mutation and its audit record land together or not at all.

Each store counts the queries it runs and the rows they return
(``queries``, ``rows_read``): tests hold the main's per-report and
per-round reads to what they must be.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from letsinfer.home import admin_gid, share_with_group
from letsinfer.store.adapters import AdapterTables
from letsinfer.store.audit import AuditTables, HeadKeeper
from letsinfer.store.canaries import CanaryTables
from letsinfer.store.connection import Connection
from letsinfer.store.controllers import ControllerTables
from letsinfer.store.evals import EvalTables
from letsinfer.store.groups import GroupTables
from letsinfer.store.join_codes import JoinCodeTables
from letsinfer.store.keys import KEY_POLICY_FIELDS, ApiKeyTables
from letsinfer.store.migrations import MIGRATIONS
from letsinfer.store.nodes import NodeTables
from letsinfer.store.people import PeopleTables
from letsinfer.store.records import (
    ApiKeyRecord,
    ArtifactReference,
    ControllerRecord,
    EnrollmentRecord,
    FactsUpdate,
    GpuClaim,
    LinkRecord,
    NodeEntry,
    NodeRecord,
    PgTaskRecord,
    PlacementGroupRecord,
    ReleaseHistoryRecord,
    ServiceRecord,
    StoreError,
    TaskSpec,
    Witness,
)
from letsinfer.store.releases import ReleaseTables
from letsinfer.store.scaling import ScalingTables
from letsinfer.store.services import ServiceTables
from letsinfer.store.webhooks import WebhookTables
from letsinfer.store.weights import WeightTables

# The records were defined here once: they are still importable from here.
__all__ = [
    "KEY_POLICY_FIELDS",
    "ApiKeyRecord",
    "ArtifactReference",
    "AuthorityStore",
    "ControllerRecord",
    "EnrollmentRecord",
    "FactsUpdate",
    "GpuClaim",
    "LinkRecord",
    "NodeEntry",
    "NodeRecord",
    "PgTaskRecord",
    "PlacementGroupRecord",
    "ReleaseHistoryRecord",
    "ServiceRecord",
    "StoreError",
    "TaskSpec",
    "Witness",
]


log = logging.getLogger("letsinfer.store")
CLUSTER_STOPPED = "cluster.stopped"  # the settings key `cluster stop` writes


class AuthorityStore(
    AuditTables,
    AdapterTables,
    ScalingTables,
    NodeTables,
    ControllerTables,
    ReleaseTables,
    ServiceTables,
    GroupTables,
    ApiKeyTables,
    WebhookTables,
    PeopleTables,
    JoinCodeTables,
    EvalTables,
    CanaryTables,
    WeightTables,
):
    def __init__(self, path: Path, anchor: HeadKeeper | None = None) -> None:
        """``anchor``: signs the audit chain's head after each commit that
        appended to it (letsinfer.audit.anchor); None where nothing can sign."""
        self.path = path
        self.anchor = anchor
        self._audit_appended = False
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            # Owner and the letsinfer group only: it holds the cluster's state and
            # audit chain. SQLite gives its -wal/-shm files the same mode.
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o660))
            path.chmod(0o660)  # past the umask
            share_with_group(path, admin_gid())  # the letsinfer group's CLI
        # Each thread opens its own store; the check stays off because a store
        # is created on one thread and may be closed on another at shutdown.
        conn = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("PRAGMA foreign_keys=OFF")  # on once migrated (see _migrate)
        self.db = Connection(conn)
        self._depth = 0
        self.queries = 0
        self.rows_read = 0
        self._migrate()
        conn.execute("PRAGMA foreign_keys=ON")

    def close(self) -> None:
        self.db.conn.close()

    # -- plumbing ---------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic unit; nested calls join the outer transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._audit_appended = False
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")
        finally:
            self._depth = 0
        if self._audit_appended:
            self._audit_appended = False
            if self.anchor is not None:
                try:
                    self.anchor.advance(self)
                except Exception:  # committed already: never undo a mutation over this
                    log.exception("could not sign the audit chain's head")

    def _migrate(self) -> None:
        """Runs before foreign keys are switched on (SQLite's way to rebuild a
        table others refer to); each step is then checked before it commits."""
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            with self.transaction():
                for statement in _statements(script):
                    self.db.execute(statement)
                broken = self.db.execute("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise StoreError(f"migration {number} breaks references: {broken[:3]}")
                self.db.execute(f"PRAGMA user_version = {number}")

    def schema_version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def _rows(
        self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()
    ) -> list[dict[str, Any]]:
        cursor = self.db.conn.execute(sql, params)
        keys = [d[0] for d in cursor.description]
        rows = [dict(zip(keys, row, strict=True)) for row in cursor.fetchall()]
        self.queries += 1
        self.rows_read += len(rows)
        return rows

    # -- what changed (migration 11's counters) -----------------------------
    def revisions(self) -> dict[str, int]:
        """Each kind of change's counter: directory, groups, nodes, revoked."""
        return {r["name"]: int(r["rev"]) for r in self._rows("SELECT name, rev FROM revisions")}

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        return self.db.execute(sql, params)

    # -- settings ---------------------------------------------------------
    def get_setting(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM settings WHERE key = ?", (key,))
        return rows[0]["value"] if rows else None

    def set_setting(self, key: str, value: str) -> None:
        self.db.execute(
            "INSERT INTO settings(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    # -- the whole cluster stopped (`letsinfer cluster stop`) ---------------
    def cluster_stop(self) -> dict[str, Any] | None:
        """When the cluster was stopped and which groups it stopped; None: it runs."""
        raw = self.get_setting(CLUSTER_STOPPED)
        return json.loads(raw) if raw is not None else None

    def set_cluster_stop(self, record: dict[str, Any] | None) -> None:
        if record is None:
            self.db.execute("DELETE FROM settings WHERE key = ?", (CLUSTER_STOPPED,))
        else:
            self.set_setting(CLUSTER_STOPPED, json.dumps(record, sort_keys=True))


def _statements(script: str) -> list[str]:
    """A migration's statements; a trigger's body holds semicolons of its own."""
    out, buf = [], ""
    for piece in script.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n;"):
                out.append(buf.strip())
            buf = ""
    if buf.strip(" \n;"):
        out.append(buf.strip())
    return out
