"""Controllers: operator workstations (or apps) paired with a one-time code.

The controller makes its own P-256 key and never exports it; the main issues
a certificate carrying exactly one role. A short comparison string, derived
from the cluster CA's fingerprint and the code, is shown on both sides so a
person can see that the controller reached the real main.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from letsinfer.store import AuthorityStore, ControllerRecord, StoreError
from letsinfer.trust import pki
from letsinfer.trust.material import ClusterCA

ROLE_RANK = {"viewer": 1, "operator": 2, "administrator": 3}


class PairingRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PairingCode:
    record: ControllerRecord
    code: str
    comparison: str


def _digest(code: str) -> str:
    return hashlib.sha256(code.strip().upper().encode()).hexdigest()


def comparison_string(ca_fingerprint: str, code: str) -> str:
    """Three short words of hex: equal on both sides only if both saw the same CA."""
    h = hashlib.sha256(f"{ca_fingerprint}|{code.strip().upper()}".encode()).hexdigest()
    return "-".join(h[i : i + 4] for i in (0, 4, 8))


def allows(role: str, needed: str) -> bool:
    return ROLE_RANK.get(role, 0) >= ROLE_RANK[needed]


def new_pairing(
    store: AuthorityStore, ca_fingerprint: str, role: str, name: str, ttl_s: float
) -> PairingCode:
    if role not in ROLE_RANK:
        raise StoreError(f"unknown role {role!r}: use viewer, operator or administrator")
    code = base64.b32encode(secrets.token_bytes(10)).decode().rstrip("=")
    with store.transaction():
        rec = store.add_controller(f"ctl-{uuid.uuid4().hex[:12]}", name, role, _digest(code), ttl_s)
        store.append_audit(
            "cli", "auth.controller.add", "ok", role="main", target=f"{name} ({role})"
        )
    return PairingCode(rec, code, comparison_string(ca_fingerprint, code))


def pair(
    store: AuthorityStore,
    ca: ClusterCA,
    code: str,
    csr_pem: str,
    refused: Callable[[str], None],
) -> tuple[ControllerRecord, bytes]:
    """``refused(reason)`` counts a refusal for the audit chain (anyone may
    try a code: a flood of guesses must not write a record each)."""
    rec = store.pending_controller_by_code(_digest(code))
    if rec is None:
        refused("unknown or used pairing code")
        raise PairingRefused(403, "unknown or already used pairing code")
    if rec.code_expires_at is not None and time.time() > rec.code_expires_at:
        refused("pairing code expired")
        raise PairingRefused(410, "this pairing code has expired; ask for a new one")
    try:
        csr = pki.load_csr(csr_pem.encode())
    except pki.CertificateError as exc:
        refused("malformed certificate request")
        raise PairingRefused(400, str(exc)) from exc
    cert_pem = ca.issue_controller(csr.public_key(), rec.id, rec.role)  # type: ignore[arg-type]
    with store.transaction():
        store.controller_paired(rec.id, pki.fingerprint(pki.load_cert(cert_pem)))
        store.append_audit(
            f"controller:{rec.name}", "auth.controller.pair", "ok", role=rec.role, target=rec.id
        )
    paired = store.get_controller(rec.id)
    assert paired is not None
    return paired, cert_pem


def listed(store: AuthorityStore) -> list[dict[str, str]]:
    """`auth controller list`: each controller's name, id, role and state
    (on the main and, through the admin API, from a controller alike)."""
    return [
        {"name": c.name, "id": c.id, "role": c.role, "state": c.state}
        for c in store.list_controllers()
    ]
