"""Nodes' SQL: membership, verified facts, the certificates a removal
revokes, and enrollments.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from letsinfer.store.bulk import stage_rows
from letsinfer.store.plumbing import Plumbing
from letsinfer.store.records import (
    EnrollmentRecord,
    FactsUpdate,
    NodeEntry,
    NodeRecord,
    StoreError,
    Witness,
    _node,
)

_NODE_NO_FACTS = (
    "id, name, role, address, state, paused, created_at, cert_fingerprint, last_seen, "
    "facts_at, removed_at, facts_seq, audit_head, audit_problem, cert_not_after"
)


class NodeTables(Plumbing):
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

    def set_node_fingerprint(self, node_id: str, cert_fingerprint: str) -> None:
        self.db.execute(
            "UPDATE nodes SET cert_fingerprint = ? WHERE id = ?", (cert_fingerprint, node_id)
        )

    def set_node_paused(self, node_id: str, paused: bool) -> None:
        self.db.execute("UPDATE nodes SET paused = ? WHERE id = ?", (int(paused), node_id))

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
