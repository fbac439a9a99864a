"""Controllers' SQL: pairing codes, paired controllers and their revocation.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from letsinfer.store.plumbing import Plumbing
from letsinfer.store.records import ControllerRecord, StoreError


class ControllerTables(Plumbing):
    if TYPE_CHECKING:

        def revoke_certificate(self, fingerprint: str, subject: str) -> None: ...

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
