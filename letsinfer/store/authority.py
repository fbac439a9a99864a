"""All SQL of the authority. Domain code calls these typed methods.

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
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from letsinfer.home import admin_gid, share_with_group
from letsinfer.store.adapters import AdapterTables
from letsinfer.store.audit import AuditTables, HeadKeeper
from letsinfer.store.bulk import stage_rows
from letsinfer.store.migrations import MIGRATIONS


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


sqlite_utils = _import_sqlite_utils()
log = logging.getLogger("letsinfer.store")
CLUSTER_STOPPED = "cluster.stopped"  # the settings key `cluster stop` writes


class StoreError(Exception):
    """The store refused a change (a constraint) or cannot be read."""


@dataclass(frozen=True)
class NodeRecord:
    id: str
    name: str
    role: str
    address: str | None
    state: str
    paused: bool
    created_at: float
    cert_fingerprint: str | None = None
    last_seen: float | None = None
    facts: dict[str, Any] | None = None  # latest verified hardware facts
    facts_at: float | None = None
    removed_at: float | None = None
    facts_seq: int | None = None  # the last accepted facts' sequence (refuses replays)
    audit_head: dict[str, Any] | None = None  # its signed audit head, as witnessed
    audit_problem: str | None = None  # what the witnessed head says is wrong
    cert_not_after: float | None = None  # expiry of the certificate it last presented


@dataclass(frozen=True)
class Witness:
    """A node's signed audit head as the main last accepted it, and what is wrong."""

    head: dict[str, Any] | None
    problem: str | None


@dataclass(frozen=True)
class NodeEntry:
    """A node's membership (no facts): what changes rarely, read by revision."""

    id: str
    name: str
    role: str
    address: str | None
    state: str
    paused: bool
    cert_fingerprint: str | None
    rev: int  # the `nodes` revision of its last change


@dataclass(frozen=True)
class FactsUpdate:
    """One node's accepted facts, as a batch writes them (see record_facts_batch)."""

    node_id: str
    facts: dict[str, Any]  # the hardware part the main keeps
    at: float  # when the main accepted them (its wall clock)
    seq: int
    cert_fingerprint: str | None = None
    witness: Witness | None = None
    cert_not_after: float | None = None

    def row(self) -> tuple[Any, ...]:
        """As the batch stores it: node id, facts (JSON), at, certificate
        fingerprint, its expiry, seq, witnessed, audit head (JSON), problem."""
        witness = self.witness
        return (
            self.node_id,
            json.dumps(self.facts, sort_keys=True),
            self.at,
            self.cert_fingerprint,
            self.cert_not_after,
            self.seq,
            witness is not None,
            json.dumps(witness.head, sort_keys=True) if witness and witness.head else None,
            witness.problem if witness else None,
        )


@dataclass(frozen=True)
class EnrollmentRecord:
    id: str
    candidate_id: str
    name: str
    address: str
    pubkey_sha256: str
    token_digest: str
    state: str
    detail: str | None
    created_at: float
    expires_at: float


@dataclass(frozen=True)
class ControllerRecord:
    id: str
    name: str
    role: str
    state: str
    code_digest: str | None
    code_expires_at: float | None
    cert_fingerprint: str | None
    created_at: float
    paired_at: float | None
    revoked_at: float | None


@dataclass(frozen=True)
class ServiceRecord:
    name: str
    artifact_digest: str
    artifact_size: int
    format: str
    source: str | None
    aliases: tuple[str, ...]
    created_at: float
    origin: dict[str, Any] | None = None  # repo, revision, commit, files (model pull)
    kind: str = "completion"  # what proves its engine: a completion or an embedding
    # An OpenAI-compatible upstream instead of placement groups (format
    # "external"): url, provider_model, key_file, ca_file, concurrency. The
    # provider's key is never here, only the file it is read from.
    external: dict[str, Any] | None = None
    fallback: str | None = None  # the model that answers when this one cannot

    @property
    def is_external(self) -> bool:
        return self.external is not None

    @property
    def external_stopped(self) -> bool:
        """An external model an administrator stopped (`model stop`)."""
        return self.external is not None and self.external.get("desired") == "stopped"


@dataclass(frozen=True)
class PlacementGroupRecord:
    id: str
    service: str
    node_id: str
    release_id: str
    target: str
    desired: str
    state: str
    endpoint: str | None
    pid: int | None
    capacity: int | None
    restarts: int
    detail: str | None
    created_at: float
    updated_at: float
    paused_reason: str | None = None  # set when a data link its plan needs was lost
    # Raised to make the group's agent start its engine afresh; the observation
    # (state, endpoint...) belongs to observed_generation.
    generation: int = 0
    observed_generation: int | None = None


@dataclass(frozen=True)
class ReleaseHistoryRecord:
    """One release a group ran (kept after the group is gone)."""

    seq: int
    service: str
    node_id: str
    pg_id: str
    release_id: str
    event: str  # installed, upgraded, restored, rolled back
    at: float


@dataclass(frozen=True)
class TaskSpec:
    """One task of a placement group as install decides it."""

    task: str  # "0" is the head; it serves the group's endpoint
    node_id: str
    address: str | None = None  # the node's data address (parallel groups)
    port: int | None = None  # fixed for parallel groups; None: the agent picks one
    gpu_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class PgTaskRecord:
    pg_id: str
    task: str
    node_id: str
    address: str | None
    port: int | None
    state: str
    detail: str | None
    updated_at: float


@dataclass(frozen=True)
class GpuClaim:
    """One GPU a placement group's task holds."""

    gpu_uuid: str
    pg_id: str
    node_id: str
    task: str


@dataclass(frozen=True)
class LinkRecord:
    node_a: str  # node_a < node_b
    node_b: str
    state: str  # proven, lost
    changed_at: float


@dataclass(frozen=True)
class ApiKeyRecord:
    id: str
    name: str
    digest: str
    prefix: str
    models: tuple[str, ...]
    concurrency: int | None
    created_at: float
    revoked_at: float | None
    band: str = "standard"  # interactive, standard or batch: its turn in the admission queue
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens (prompt + completion) per minute
    budget_tokens: int | None = None  # tokens per budget_period
    budget_period: str | None = None  # day, week or month (UTC calendar)
    cache_ttl_s: int | None = None  # None: no response cache for this key
    cache_sampled: bool = False  # also cache answers sampled at a non-zero temperature


# What `auth key limits` may change on a key, and the store's column for each.
KEY_POLICY_FIELDS = (
    "band",
    "rpm",
    "tpm",
    "budget_tokens",
    "budget_period",
    "cache_ttl_s",
    "cache_sampled",
)


@dataclass(frozen=True)
class ArtifactReference:
    digest: str  # sha256 hex, as the holder records it
    holder_kind: str  # "model service" or "runtime release"
    holder: str  # its name or id


class AuthorityStore(AuditTables, AdapterTables):
    def __init__(self, path: Path, anchor: HeadKeeper | None = None) -> None:
        """``anchor``: signs the audit chain's head after each commit that
        appended to it (letsinfer.authority.anchor); None where nothing can sign."""
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
        self.db = sqlite_utils.Database(conn)
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

    # -- nodes ------------------------------------------------------------
    def add_node(
        self,
        node_id: str,
        name: str,
        role: str,
        address: str | None,
        cert_fingerprint: str | None = None,
    ) -> NodeRecord:
        try:
            self.db["nodes"].insert(
                {
                    "id": node_id,
                    "name": name,
                    "role": role,
                    "address": address,
                    "state": "active",
                    "paused": 0,
                    "created_at": time.time(),
                    "cert_fingerprint": cert_fingerprint,
                }
            )
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"node {name!r} cannot be added: {exc}") from exc
        node = self.get_node(node_id)
        assert node is not None
        return node

    def get_node(self, node_id: str, facts: bool = True) -> NodeRecord | None:
        """``facts``: False leaves the node's facts unread (``facts`` None): a
        report's path needs its membership and sequence, not its last facts."""
        columns = "*" if facts else _NODE_NO_FACTS
        rows = self._rows(f"SELECT {columns} FROM nodes WHERE id = ?", (node_id,))
        return _node(rows[0]) if rows else None

    def list_nodes(self, include_removed: bool = False) -> list[NodeRecord]:
        where = "" if include_removed else " WHERE state != 'removed'"
        return [_node(r) for r in self._rows(f"SELECT * FROM nodes{where} ORDER BY created_at")]

    def nodes_changed_since(self, rev: int) -> list[NodeEntry]:
        """Nodes added or changed (membership, not facts) after revision ``rev``."""
        rows = self._rows(
            "SELECT id, name, role, address, state, paused, cert_fingerprint, rev "
            "FROM nodes WHERE rev > ? ORDER BY rev",
            (rev,),
        )
        return [
            NodeEntry(
                r["id"],
                r["name"],
                r["role"],
                r["address"],
                r["state"],
                bool(r["paused"]),
                r["cert_fingerprint"],
                int(r["rev"]),
            )
            for r in rows
        ]

    def paused_node_ids(self) -> set[str]:
        return {r["id"] for r in self._rows("SELECT id FROM nodes WHERE paused = 1")}

    def find_node(self, name_or_id: str) -> NodeRecord | None:
        rows = self._rows(
            "SELECT * FROM nodes WHERE (id = :n OR name = :n) AND state != 'removed'",
            {"n": name_or_id},
        )
        return _node(rows[0]) if rows else None

    def record_node_facts(
        self,
        node_id: str,
        facts: dict[str, Any],
        cert_fingerprint: str | None = None,
        seq: int | None = None,
        witness: Witness | None = None,
        cert_not_after: float | None = None,
    ) -> None:
        """Latest verified facts; also when the node was last heard from, by
        which certificate (the one a removal revokes) and until when it is
        valid, the facts' sequence (so a replay is refused after a restart too)
        and its witnessed audit head. One write per report."""
        now = time.time()
        head = json.dumps(witness.head, sort_keys=True) if witness and witness.head else None
        self.db.execute(
            "UPDATE nodes SET facts = ?, facts_at = ?, last_seen = ?, "
            "cert_fingerprint = COALESCE(?, cert_fingerprint), "
            "cert_not_after = COALESCE(?, cert_not_after), "
            "facts_seq = COALESCE(?, facts_seq), "
            "audit_head = CASE WHEN ? THEN ? ELSE audit_head END, "
            "audit_problem = CASE WHEN ? THEN ? ELSE audit_problem END "
            "WHERE id = ?",
            (
                json.dumps(facts, sort_keys=True),
                now,
                now,
                cert_fingerprint,
                cert_not_after,
                seq,
                witness is not None,
                head,
                witness is not None,
                witness.problem if witness else None,
                node_id,
            ),
        )

    def record_facts_batch(self, updates: list[FactsUpdate], heard: dict[str, float]) -> None:
        """Many nodes' accepted facts (one update per node) in the caller's
        transaction (a batch, see letsinfer.authority.factwriter); ``heard``:
        nodes whose reports the main heard but did not take (it was shedding
        load), with when: they are alive, so ``last_seen`` moves.

        The rows go into a temporary table a few hundred per statement, then
        one UPDATE applies them all: one statement per node made this thread
        win the GIL back from a busy gateway loop once per node (see
        letsinfer.store.bulk)."""
        conn = self.db.conn
        if updates:  # a batch may carry only heard nodes and other writes
            stage_rows(
                conn,
                "facts_batch (id TEXT PRIMARY KEY, facts TEXT, at REAL, fingerprint TEXT, "
                "not_after REAL, seq INTEGER, witnessed INTEGER, head TEXT, problem TEXT)",
                [u.row() for u in updates],
            )
            conn.execute(
                "UPDATE nodes SET (facts, facts_at, last_seen, cert_fingerprint, cert_not_after, "
                "facts_seq, audit_head, audit_problem) = ("
                "SELECT b.facts, b.at, b.at, COALESCE(b.fingerprint, nodes.cert_fingerprint), "
                "COALESCE(b.not_after, nodes.cert_not_after), "
                "MAX(COALESCE(nodes.facts_seq, 0), b.seq), "
                "CASE WHEN b.witnessed THEN b.head ELSE nodes.audit_head END, "
                "CASE WHEN b.witnessed THEN b.problem ELSE nodes.audit_problem END "
                "FROM temp.facts_batch b WHERE b.id = nodes.id) "
                "WHERE id IN (SELECT id FROM temp.facts_batch)"
            )
        if heard:
            stage_rows(conn, "heard_batch (id TEXT PRIMARY KEY, at REAL)", list(heard.items()))
            conn.execute(
                "UPDATE nodes SET last_seen = MAX(COALESCE(last_seen, 0), "
                "(SELECT h.at FROM temp.heard_batch h WHERE h.id = nodes.id)) "
                "WHERE id IN (SELECT id FROM temp.heard_batch)"
            )

    def delete_placement_group(self, pg_id: str) -> None:
        """Gone from the desired state; its GPUs are free again (cascade)."""
        self.db.execute("DELETE FROM placement_groups WHERE id = ?", (pg_id,))

    def set_node_fingerprint(self, node_id: str, cert_fingerprint: str) -> None:
        self.db.execute(
            "UPDATE nodes SET cert_fingerprint = ? WHERE id = ?", (cert_fingerprint, node_id)
        )

    def remove_node(self, node_id: str) -> None:
        """Mark removed and revoke its certificate; the row stays for the record
        and its name is free for a new enrollment."""
        with self.transaction():
            node = self.get_node(node_id)
            if node is None:
                raise StoreError(f"no node {node_id}")
            self.db.execute(
                "UPDATE nodes SET state = 'removed', removed_at = ? WHERE id = ?",
                (time.time(), node_id),
            )
            if node.cert_fingerprint:
                self.revoke_certificate(node.cert_fingerprint, f"node:{node_id}")

    # -- certificates -----------------------------------------------------
    def revoke_certificate(self, fingerprint: str, subject: str) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO revoked_certificates(fingerprint, subject, revoked_at) "
            "VALUES (?, ?, ?)",
            (fingerprint, subject, time.time()),
        )

    def revoked_fingerprints(self) -> list[str]:
        rows = self._rows("SELECT fingerprint FROM revoked_certificates ORDER BY fingerprint")
        return [r["fingerprint"] for r in rows]

    def is_revoked(self, fingerprint: str) -> bool:
        return bool(
            self._rows("SELECT 1 FROM revoked_certificates WHERE fingerprint = ?", (fingerprint,))
        )

    # -- enrollment -------------------------------------------------------
    def add_enrollment(
        self,
        enrollment_id: str,
        candidate_id: str,
        name: str,
        address: str,
        pubkey_sha256: str,
        token_digest: str,
        ttl_s: float,
    ) -> EnrollmentRecord:
        now = time.time()
        self.db["enrollments"].insert(
            {
                "id": enrollment_id,
                "candidate_id": candidate_id,
                "name": name,
                "address": address,
                "pubkey_sha256": pubkey_sha256,
                "token_digest": token_digest,
                "state": "pending",
                "detail": None,
                "created_at": now,
                "expires_at": now + ttl_s,
            }
        )
        rec = self.get_enrollment(enrollment_id)
        assert rec is not None
        return rec

    def get_enrollment(self, enrollment_id: str) -> EnrollmentRecord | None:
        rows = self._rows("SELECT * FROM enrollments WHERE id = ?", (enrollment_id,))
        return EnrollmentRecord(**rows[0]) if rows else None

    def set_enrollment_state(
        self, enrollment_id: str, state: str, detail: str | None = None
    ) -> None:
        self.db.execute(
            "UPDATE enrollments SET state = ?, detail = ? WHERE id = ?",
            (state, detail, enrollment_id),
        )

    # -- controllers ------------------------------------------------------
    def add_controller(
        self, controller_id: str, name: str, role: str, code_digest: str, ttl_s: float
    ) -> ControllerRecord:
        now = time.time()
        self.db["controllers"].insert(
            {
                "id": controller_id,
                "name": name,
                "role": role,
                "state": "pending",
                "code_digest": code_digest,
                "code_expires_at": now + ttl_s,
                "cert_fingerprint": None,
                "created_at": now,
                "paired_at": None,
                "revoked_at": None,
            }
        )
        rec = self.get_controller(controller_id)
        assert rec is not None
        return rec

    def get_controller(self, controller_id: str) -> ControllerRecord | None:
        rows = self._rows("SELECT * FROM controllers WHERE id = ?", (controller_id,))
        return ControllerRecord(**rows[0]) if rows else None

    def find_controller(self, name_or_id: str) -> ControllerRecord | None:
        rows = self._rows(
            "SELECT * FROM controllers WHERE (id = :n OR name = :n) AND state != 'revoked' "
            "ORDER BY created_at DESC",
            {"n": name_or_id},
        )
        return ControllerRecord(**rows[0]) if rows else None

    def pending_controller_by_code(self, code_digest: str) -> ControllerRecord | None:
        rows = self._rows(
            "SELECT * FROM controllers WHERE code_digest = ? AND state = 'pending'", (code_digest,)
        )
        return ControllerRecord(**rows[0]) if rows else None

    def list_controllers(self) -> list[ControllerRecord]:
        return [
            ControllerRecord(**r)
            for r in self._rows("SELECT * FROM controllers ORDER BY created_at")
        ]

    def controller_paired(self, controller_id: str, cert_fingerprint: str) -> None:
        self.db.execute(
            "UPDATE controllers SET state = 'paired', code_digest = NULL, paired_at = ?, "
            "cert_fingerprint = ? WHERE id = ? AND state = 'pending'",
            (time.time(), cert_fingerprint, controller_id),
        )

    def revoke_controller(self, controller_id: str) -> None:
        with self.transaction():
            rec = self.get_controller(controller_id)
            if rec is None:
                raise StoreError(f"no controller {controller_id}")
            self.db.execute(
                "UPDATE controllers SET state = 'revoked', code_digest = NULL, revoked_at = ? "
                "WHERE id = ?",
                (time.time(), controller_id),
            )
            if rec.cert_fingerprint:
                self.revoke_certificate(rec.cert_fingerprint, f"controller:{controller_id}")

    # -- runtime releases -------------------------------------------------
    def ensure_release(
        self,
        release_id: str,
        engine: str,
        version: str,
        target: str,
        artifacts: dict[str, str],
        launch: dict[str, Any],
        signature: str | None = None,
    ) -> None:
        """Record a release once; an id never changes meaning."""
        self.db.execute(
            "INSERT OR IGNORE INTO runtime_releases"
            "(id, engine, version, target, artifacts, launch, signature, created_at) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (
                release_id,
                engine,
                version,
                target,
                json.dumps(artifacts, sort_keys=True),
                json.dumps(launch, sort_keys=True),
                signature,
                time.time(),
            ),
        )

    def get_release(self, release_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM runtime_releases WHERE id = ?", (release_id,))
        if not rows:
            return None
        row = rows[0]
        row["artifacts"] = json.loads(row["artifacts"])
        row["launch"] = json.loads(row["launch"])
        return row

    def list_releases(self) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM runtime_releases ORDER BY created_at, id")
        for row in rows:
            row["artifacts"] = json.loads(row["artifacts"])
            row["launch"] = json.loads(row["launch"])
        return rows

    def list_artifact_references(self) -> list[ArtifactReference]:
        """Every artifact digest a model service or a runtime release needs."""
        rows = self._rows(
            "SELECT artifact_digest AS digest, 'model service' AS holder_kind, name AS holder "
            "FROM model_services WHERE external IS NULL UNION ALL "
            "SELECT artifact_digest, 'LoRA adapter', name FROM model_adapters UNION ALL "
            "SELECT j.value, 'runtime release', r.id "
            "FROM runtime_releases r, json_each(r.artifacts) j ORDER BY 1, 2, 3"
        )
        return [ArtifactReference(**r) for r in rows]

    # -- model services and placement groups ------------------------------
    def add_service(
        self,
        name: str,
        artifact_digest: str,
        artifact_size: int,
        fmt: str,
        source: str | None,
        aliases: tuple[str, ...] = (),
        origin: dict[str, Any] | None = None,
        *,
        kind: str = "completion",
        external: dict[str, Any] | None = None,
        fallback: str | None = None,
    ) -> ServiceRecord:
        self.check_new_names(name, aliases)
        self.db["model_services"].insert(
            {
                "name": name,
                "artifact_digest": artifact_digest,
                "artifact_size": artifact_size,
                "format": fmt,
                "source": source,
                "aliases": json.dumps(list(aliases)),
                "created_at": time.time(),
                "origin": json.dumps(origin, sort_keys=True) if origin is not None else None,
                "kind": kind,
                "external": json.dumps(external, sort_keys=True) if external is not None else None,
                "fallback": fallback,
            }
        )
        svc = self.get_service(name)
        assert svc is not None
        return svc

    def get_service(self, name: str) -> ServiceRecord | None:
        rows = self._rows("SELECT * FROM model_services WHERE name = ?", (name,))
        return _service(rows[0]) if rows else None

    def resolve_service(self, name_or_alias: str) -> ServiceRecord | None:
        rows = self._rows(
            "SELECT m.* FROM model_services m WHERE m.name = :n OR EXISTS "
            "(SELECT 1 FROM json_each(m.aliases) WHERE json_each.value = :n)",
            {"n": name_or_alias},
        )
        return _service(rows[0]) if rows else None

    def list_services(self) -> list[ServiceRecord]:
        return [_service(r) for r in self._rows("SELECT * FROM model_services ORDER BY name")]

    def check_new_names(self, name: str, aliases: tuple[str, ...] = ()) -> None:
        """A new model's name and aliases: each given once, none the model's
        own name, and none taken by another model, alias or adapter."""
        seen: set[str] = set()
        for alias in aliases:
            if alias == name:
                raise StoreError(
                    f"alias {alias!r} is the model's own name: clients can already use it"
                )
            if alias in seen:
                raise StoreError(f"alias {alias!r} is given twice")
            seen.add(alias)
        self.check_name_free(name)
        for alias in aliases:
            try:
                self.check_name_free(alias)
            except StoreError as exc:
                raise StoreError(f"alias {alias!r} cannot be given: {exc}") from None

    def check_name_free(self, name: str) -> None:
        """Models, their aliases and LoRA adapters share one namespace: the
        name a client puts in ``model`` picks exactly one of them."""
        holder = self.resolve_service(name)
        if holder is not None and holder.name == name:
            raise StoreError(f"model {name!r} already exists")
        if holder is not None:
            raise StoreError(f"the name {name!r} is already an alias of model {holder.name}")
        adapter = self.get_adapter(name)
        if adapter is not None:
            raise StoreError(
                f"the name {name!r} is already taken by a LoRA adapter of {adapter.service}"
            )

    def set_fallback(self, name: str, fallback: str | None) -> None:
        self.db.execute("UPDATE model_services SET fallback = ? WHERE name = ?", (fallback, name))

    def set_external_desired(self, name: str, desired: str) -> int:
        """``model stop``/``start`` of an external model (it has no groups): its
        record says whether the gateway publishes it. 1 if it changed."""
        svc = self.get_service(name)
        if svc is None or svc.external is None:
            return 0
        external = {k: v for k, v in svc.external.items() if k != "desired"}
        if desired != "running":
            external["desired"] = desired
        if external == svc.external:
            return 0
        self.db.execute(
            "UPDATE model_services SET external = ? WHERE name = ?",
            (json.dumps(external, sort_keys=True), name),
        )
        return 1

    def add_placement_group(
        self,
        pg_id: str,
        service: str,
        node_id: str,
        release_id: str,
        target: str,
        gpu_uuids: tuple[str, ...] = (),
        event: str | None = "installed",
    ) -> PlacementGroupRecord:
        """A single-task group: its one task runs on ``node_id``."""
        return self.add_parallel_placement_group(
            pg_id,
            service,
            release_id,
            target,
            [TaskSpec("0", node_id, gpu_uuids=gpu_uuids)],
            event,
        )

    def add_parallel_placement_group(
        self,
        pg_id: str,
        service: str,
        release_id: str,
        target: str,
        tasks: list[TaskSpec],
        event: str | None = "installed",
    ) -> PlacementGroupRecord:
        """A group and all its tasks and GPUs, or nothing (one transaction).
        The group's ``node_id`` is its head's (task "0"); ``event`` names why
        in its release history (None: the caller records it once it serves)."""
        if not tasks or tasks[0].task != "0":
            raise StoreError("a placement group needs task 0 (its head) first")
        now = time.time()
        with self.transaction():
            self.db["placement_groups"].insert(
                {
                    "id": pg_id,
                    "service": service,
                    "node_id": tasks[0].node_id,
                    "release_id": release_id,
                    "target": target,
                    "desired": "running",
                    "state": "pending",
                    "restarts": 0,
                    "created_at": now,
                    "updated_at": now,
                }
            )
            for t in tasks:
                try:
                    self.db["pg_tasks"].insert(
                        {
                            "pg_id": pg_id,
                            "task": t.task,
                            "node_id": t.node_id,
                            "address": t.address,
                            "port": t.port,
                            "state": "pending",
                            "updated_at": now,
                        }
                    )
                except sqlite3.IntegrityError as exc:
                    raise StoreError(
                        f"task {t.task} of {pg_id} on node {t.node_id} conflicts: {exc}"
                    ) from exc
                for uuid in t.gpu_uuids:
                    try:
                        self.db["pg_devices"].insert(
                            {"gpu_uuid": uuid, "pg_id": pg_id, "node_id": t.node_id, "task": t.task}
                        )
                    except sqlite3.IntegrityError as exc:
                        raise StoreError(
                            f"GPU {uuid} already belongs to an active placement group"
                        ) from exc
            if event is not None:
                self.add_release_history(service, tasks[0].node_id, pg_id, release_id, event)
        pg = self.get_placement_group(pg_id)
        assert pg is not None
        return pg

    def parallel_groups(self) -> list[tuple[PlacementGroupRecord, list[PgTaskRecord]]]:
        """Every group meant to run with more than one task, with its tasks (the
        groups whose plans need data links): two queries, whatever the cluster's size."""
        groups = {
            r["id"]: _pg(r)
            for r in self._rows(
                "SELECT * FROM placement_groups WHERE desired = 'running' AND id IN "
                "(SELECT pg_id FROM pg_tasks GROUP BY pg_id HAVING COUNT(*) > 1) "
                "ORDER BY created_at"
            )
        }
        if not groups:
            return []
        marks = ", ".join("?" * len(groups))
        tasks: dict[str, list[PgTaskRecord]] = {g: [] for g in groups}
        for r in self._rows(
            f"SELECT * FROM pg_tasks WHERE pg_id IN ({marks}) "
            "ORDER BY pg_id, CAST(task AS INTEGER), task",
            tuple(groups),
        ):
            tasks[r["pg_id"]].append(PgTaskRecord(**r))
        return [(g, tasks[g.id]) for g in groups.values()]

    def pg_tasks(self, pg_id: str) -> list[PgTaskRecord]:
        rows = self._rows(
            "SELECT * FROM pg_tasks WHERE pg_id = ? ORDER BY CAST(task AS INTEGER), task", (pg_id,)
        )
        return [PgTaskRecord(**r) for r in rows]

    def tasks_on_node(self, node_id: str) -> list[PgTaskRecord]:
        rows = self._rows(
            "SELECT * FROM pg_tasks WHERE node_id = ? ORDER BY pg_id, task", (node_id,)
        )
        return [PgTaskRecord(**r) for r in rows]

    def task_ports_in_use(self, node_id: str) -> set[int]:
        rows = self._rows(
            "SELECT port FROM pg_tasks WHERE node_id = ? AND port IS NOT NULL", (node_id,)
        )
        return {int(r["port"]) for r in rows}

    def task_gpus(self, pg_id: str, task: str) -> list[str]:
        rows = self._rows(
            "SELECT gpu_uuid FROM pg_devices WHERE pg_id = ? AND task = ? ORDER BY gpu_uuid",
            (pg_id, task),
        )
        return [r["gpu_uuid"] for r in rows]

    def record_task_observation(
        self, pg_id: str, task: str, state: str, detail: str | None
    ) -> None:
        self.db.execute(
            "UPDATE pg_tasks SET state = ?, detail = ?, updated_at = ? "
            "WHERE pg_id = ? AND task = ?",
            (state, detail, time.time(), pg_id, task),
        )

    def set_pg_paused(self, pg_id: str, reason: str | None) -> None:
        self.db.execute(
            "UPDATE placement_groups SET paused_reason = ?, updated_at = ? WHERE id = ?",
            (reason, time.time(), pg_id),
        )

    # -- data links ---------------------------------------------------------
    def list_links(self) -> list[LinkRecord]:
        return [LinkRecord(**r) for r in self._rows("SELECT * FROM links ORDER BY node_a, node_b")]

    def set_link_state(self, node_a: str, node_b: str, state: str) -> None:
        a, b = sorted((node_a, node_b))
        self.db.execute(
            "INSERT INTO links(node_a, node_b, state, changed_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(node_a, node_b) DO UPDATE SET state = excluded.state, "
            "changed_at = excluded.changed_at",
            (a, b, state, time.time()),
        )

    def get_placement_group(self, pg_id: str) -> PlacementGroupRecord | None:
        rows = self._rows("SELECT * FROM placement_groups WHERE id = ?", (pg_id,))
        return _pg(rows[0]) if rows else None

    def list_placement_groups(
        self,
        node_id: str | None = None,
        service: str | None = None,
    ) -> list[PlacementGroupRecord]:
        sql = "SELECT * FROM placement_groups WHERE 1=1"
        params: dict[str, Any] = {}
        if node_id is not None:
            sql += " AND node_id = :node"
            params["node"] = node_id
        if service is not None:
            sql += " AND service = :service"
            params["service"] = service
        return [_pg(r) for r in self._rows(sql + " ORDER BY created_at", params)]

    def pg_gpus(self, pg_id: str) -> list[str]:
        rows = self._rows(
            "SELECT gpu_uuid FROM pg_devices WHERE pg_id = ? ORDER BY gpu_uuid", (pg_id,)
        )
        return [r["gpu_uuid"] for r in rows]

    def gpu_claims(self) -> list[GpuClaim]:
        """Every GPU held by a placement group, across the cluster."""
        rows = self._rows("SELECT gpu_uuid, pg_id, node_id, task FROM pg_devices ORDER BY gpu_uuid")
        return [GpuClaim(**r) for r in rows]

    def gpus_in_use(self, node_id: str) -> set[str]:
        rows = self._rows("SELECT gpu_uuid FROM pg_devices WHERE node_id = ?", (node_id,))
        return {r["gpu_uuid"] for r in rows}

    def set_node_paused(self, node_id: str, paused: bool) -> None:
        self.db.execute("UPDATE nodes SET paused = ? WHERE id = ?", (int(paused), node_id))

    def set_service_desired(self, service: str, desired: str) -> int:
        cur = self.db.execute(
            "UPDATE placement_groups SET desired = ?, updated_at = ? WHERE service = ?",
            (desired, time.time(), service),
        )
        return cur.rowcount

    def set_groups_desired(self, pg_ids: list[str], desired: str) -> None:
        for pg_id in pg_ids:
            self.db.execute(
                "UPDATE placement_groups SET desired = ?, updated_at = ? WHERE id = ?",
                (desired, time.time(), pg_id),
            )

    def restart_groups(self, pg_ids: list[str]) -> None:
        """A new generation: each group's agent starts its engine afresh."""
        for pg_id in pg_ids:
            self.db.execute(
                "UPDATE placement_groups SET generation = generation + 1, updated_at = ? "
                "WHERE id = ?",
                (time.time(), pg_id),
            )

    def set_pg_release(self, pg_id: str, release_id: str) -> None:
        """The group runs another release from its next generation (the caller
        raises it, and records the release history once it serves)."""
        if self.get_release(release_id) is None:
            raise StoreError(f"no runtime release {release_id!r}")
        self.db.execute(
            "UPDATE placement_groups SET release_id = ?, updated_at = ? WHERE id = ?",
            (release_id, time.time(), pg_id),
        )

    def add_release_history(
        self, service: str, node_id: str, pg_id: str, release_id: str, event: str
    ) -> None:
        self.db.execute(
            "INSERT INTO release_history(service, node_id, pg_id, release_id, event, at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (service, node_id, pg_id, release_id, event, time.time()),
        )

    def release_history(self, service: str) -> list[ReleaseHistoryRecord]:
        rows = self._rows(
            "SELECT * FROM release_history WHERE service = ? ORDER BY seq", (service,)
        )
        return [ReleaseHistoryRecord(**r) for r in rows]

    def delete_service(self, name: str) -> None:
        """The model and its placement groups (cascade), and its release history."""
        with self.transaction():
            # A model that fell back to it, or to one of its adapters (they go
            # with it), answers for itself again.
            for table in ("model_services", "model_adapters"):
                self.db.execute(
                    f"UPDATE {table} SET fallback = NULL WHERE fallback = ? OR fallback IN "
                    "(SELECT name FROM model_adapters WHERE service = ?)",
                    (name, name),
                )
            self.db.execute("DELETE FROM placement_groups WHERE service = ?", (name,))
            self.db.execute("DELETE FROM release_history WHERE service = ?", (name,))
            self.db.execute("DELETE FROM model_services WHERE name = ?", (name,))

    def services_using(self, digest: str) -> list[str]:
        rows = self._rows(
            "SELECT name FROM model_services WHERE artifact_digest = ? AND external IS NULL "
            "UNION SELECT name FROM model_adapters WHERE artifact_digest = ? ORDER BY name",
            (digest, digest),
        )
        return [r["name"] for r in rows]

    def record_pg_observation(
        self,
        pg_id: str,
        *,
        state: str,
        endpoint: str | None = None,
        pid: int | None = None,
        capacity: int | None = None,
        restarts: int | None = None,
        detail: str | None = None,
        generation: int | None = None,
    ) -> None:
        """What the agent saw (of ``generation``, when it says); desired state is
        never touched here."""
        fields: dict[str, Any] = {
            "state": state,
            "endpoint": endpoint,
            "pid": pid,
            "capacity": capacity,
            "detail": detail,
            "updated_at": time.time(),
        }
        if restarts is not None:
            fields["restarts"] = restarts
        if generation is not None:
            fields["observed_generation"] = generation
        sets = ", ".join(f"{k} = :{k}" for k in fields)
        self.db.execute(
            f"UPDATE placement_groups SET {sets} WHERE id = :id", {**fields, "id": pg_id}
        )

    # -- API keys ---------------------------------------------------------
    def add_api_key(
        self,
        key_id: str,
        name: str,
        digest: str,
        prefix: str,
        models: tuple[str, ...],
        concurrency: int | None,
        policy: dict[str, Any] | None = None,
    ) -> ApiKeyRecord:
        """``policy``: any of KEY_POLICY_FIELDS (band, limits, cache)."""
        try:
            self.db["api_keys"].insert(
                {
                    "id": key_id,
                    "name": name,
                    "digest": digest,
                    "prefix": prefix,
                    "models": json.dumps(list(models)),
                    "concurrency": concurrency,
                    "created_at": time.time(),
                    "revoked_at": None,
                    **_policy_columns(policy or {}),
                }
            )
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"an active API key named {name!r} already exists") from exc
        return self.list_api_keys(include_revoked=True, name=name)[-1]

    def list_api_keys(
        self, include_revoked: bool = False, name: str | None = None
    ) -> list[ApiKeyRecord]:
        sql = "SELECT * FROM api_keys WHERE 1=1"
        params: dict[str, Any] = {}
        if not include_revoked:
            sql += " AND revoked_at IS NULL"
        if name is not None:
            sql += " AND name = :name"
            params["name"] = name
        return [_key(r) for r in self._rows(sql + " ORDER BY created_at", params)]

    def set_key_policy(self, name: str, policy: dict[str, Any]) -> bool:
        """Change an active key's band, limits or cache (KEY_POLICY_FIELDS)."""
        columns = _policy_columns(policy)
        if not columns:
            return bool(self.list_api_keys(name=name))
        sets = ", ".join(f"{k} = :{k}" for k in columns)
        cur = self.db.execute(
            f"UPDATE api_keys SET {sets} WHERE name = :name AND revoked_at IS NULL",
            {**columns, "name": name},
        )
        return cur.rowcount > 0

    def set_key_models(self, name: str, models: tuple[str, ...]) -> bool:
        """Replace an active key's model list (its callers never leave it
        empty: an empty list allows every model)."""
        cur = self.db.execute(
            "UPDATE api_keys SET models = ? WHERE name = ? AND revoked_at IS NULL",
            (json.dumps(list(models)), name),
        )
        return cur.rowcount > 0

    def revoke_api_key(self, name: str) -> bool:
        cur = self.db.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
            (time.time(), name),
        )
        return cur.rowcount > 0


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


_NODE_NO_FACTS = (
    "id, name, role, address, state, paused, created_at, cert_fingerprint, last_seen, "
    "facts_at, removed_at, facts_seq, audit_head, audit_problem, cert_not_after"
)


def _node(r: dict[str, Any]) -> NodeRecord:
    return NodeRecord(
        id=r["id"],
        name=r["name"],
        role=r["role"],
        address=r["address"],
        state=r["state"],
        paused=bool(r["paused"]),
        created_at=r["created_at"],
        cert_fingerprint=r["cert_fingerprint"],
        last_seen=r["last_seen"],
        facts=json.loads(r["facts"]) if r.get("facts") else None,
        facts_at=r.get("facts_at"),
        removed_at=r.get("removed_at"),
        facts_seq=r.get("facts_seq"),
        audit_head=json.loads(r["audit_head"]) if r.get("audit_head") else None,
        audit_problem=r.get("audit_problem"),
        cert_not_after=r.get("cert_not_after"),
    )


def _service(r: dict[str, Any]) -> ServiceRecord:
    return ServiceRecord(
        name=r["name"],
        artifact_digest=r["artifact_digest"],
        artifact_size=r["artifact_size"],
        format=r["format"],
        source=r["source"],
        aliases=tuple(json.loads(r["aliases"])),
        created_at=r["created_at"],
        origin=json.loads(r["origin"]) if r.get("origin") else None,
        kind=r.get("kind") or "completion",
        external=json.loads(r["external"]) if r.get("external") else None,
        fallback=r.get("fallback"),
    )


def _pg(r: dict[str, Any]) -> PlacementGroupRecord:
    return PlacementGroupRecord(**r)


def _key(r: dict[str, Any]) -> ApiKeyRecord:
    return ApiKeyRecord(
        id=r["id"],
        name=r["name"],
        digest=r["digest"],
        prefix=r["prefix"],
        models=tuple(json.loads(r["models"])),
        concurrency=r["concurrency"],
        created_at=r["created_at"],
        revoked_at=r["revoked_at"],
        band=r.get("band") or "standard",
        rpm=r.get("rpm"),
        tpm=r.get("tpm"),
        budget_tokens=r.get("budget_tokens"),
        budget_period=r.get("budget_period"),
        cache_ttl_s=r.get("cache_ttl_s"),
        cache_sampled=bool(r.get("cache_sampled")),
    )


def _policy_columns(policy: dict[str, Any]) -> dict[str, Any]:
    unknown = set(policy) - set(KEY_POLICY_FIELDS)
    if unknown:
        raise StoreError(f"not a key policy field: {', '.join(sorted(unknown))}")
    return {k: int(v) if k == "cache_sampled" else v for k, v in policy.items()}
