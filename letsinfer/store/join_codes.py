"""Join codes' SQL (letsinfer.authority.joining): each code's id, the public
verifier of its secret (never the secret), its expiry, its wrong proofs and
what became of it.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from letsinfer.store.plumbing import Plumbing

OPEN, USED, BURNT = "open", "used", "burnt"


@dataclass(frozen=True)
class JoinCodeRecord:
    id: str
    verifier: str
    state: str  # open | used | burnt
    wrong_proofs: int
    created_at: float
    expires_at: float
    used_at: float | None
    node_id: str | None  # the node it enrolled


class JoinCodeTables(Plumbing):
    def add_join_code(self, code_id: str, verifier: str, ttl_s: float) -> JoinCodeRecord:
        now = time.time()
        self.db.execute(
            "INSERT INTO join_codes(id, verifier, state, wrong_proofs, created_at, expires_at) "
            "VALUES (?, ?, ?, 0, ?, ?)",
            (code_id, verifier, OPEN, now, now + ttl_s),
        )
        rec = self.get_join_code(code_id)
        assert rec is not None
        return rec

    def get_join_code(self, code_id: str) -> JoinCodeRecord | None:
        rows = self._rows("SELECT * FROM join_codes WHERE id = ?", (code_id,))
        return JoinCodeRecord(**rows[0]) if rows else None

    def join_code_wrong_proof(self, code_id: str, burn_at: int) -> JoinCodeRecord:
        """Count a wrong proof; the code is burnt at ``burn_at`` of them."""
        self.db.execute(
            "UPDATE join_codes SET wrong_proofs = wrong_proofs + 1, "
            "state = CASE WHEN wrong_proofs + 1 >= ? THEN ? ELSE state END "
            "WHERE id = ? AND state = ?",
            (burn_at, BURNT, code_id, OPEN),
        )
        rec = self.get_join_code(code_id)
        assert rec is not None
        return rec

    def join_code_used(self, code_id: str, node_id: str) -> bool:
        """Mark an open code used by ``node_id``; False if it was not open
        (another use won the race)."""
        done = self.db.execute(
            "UPDATE join_codes SET state = ?, used_at = ?, node_id = ? WHERE id = ? AND state = ?",
            (USED, time.time(), node_id, code_id, OPEN),
        )
        return bool(done.rowcount)
