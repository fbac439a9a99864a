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


MAX_NAME = 64


class NameTaken(StoreError):
    """Another controller not revoked is called so."""


def new_pairing(
    store: AuthorityStore,
    ca_fingerprint: str,
    role: str,
    name: str,
    ttl_s: float,
    actor: str = "cli",
    actor_role: str = "main",
) -> PairingCode:
    """A one-time pairing code for a controller called ``name``. StoreError,
    with nothing made: an unknown role, a name that is empty, too long or
    holds control characters, or one a controller holds already (paired, or
    pending with a code still valid): `auth controller revoke` takes a name,
    and two alike would make it revoke one of them at random."""
    if role not in ROLE_RANK:
        raise StoreError(f"unknown role {role!r}: use viewer, operator or administrator")
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise StoreError(
            f"a controller's name is 1 to {MAX_NAME} printable characters, not {name[:80]!r}"
        )
    code = base64.b32encode(secrets.token_bytes(10)).decode().rstrip("=")
    with store.transaction():
        if any(_holds_name(c, name) for c in store.list_controllers()):
            raise NameTaken(
                f"a controller named {name!r} exists already (`letsinfer auth controller "
                "list`): choose another --name, or revoke it first. Nothing changed."
            )
        rec = store.add_controller(f"ctl-{uuid.uuid4().hex[:12]}", name, role, _digest(code), ttl_s)
        store.append_audit(
            actor, "auth.controller.add", "ok", role=actor_role, target=f"{name} ({role})"
        )
    return PairingCode(rec, code, comparison_string(ca_fingerprint, code))


def _holds_name(rec: ControllerRecord, name: str) -> bool:
    if rec.name != name or rec.state == "revoked":
        return False
    if rec.state == "pending":  # an expired code holds nothing
        return rec.code_expires_at is None or rec.code_expires_at > time.time()
    return True


class RevokeRefused(StoreError):
    """``status``: 404 no such controller, 409 a controller revoking itself."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def revoke(
    store: AuthorityStore,
    name: str,
    actor: str = "cli",
    actor_role: str | None = None,
    caller_id: str | None = None,
) -> ControllerRecord:
    """Revoke the active controller ``name`` (or id): its certificate is
    refused from now on. ``caller_id``: the controller asking, which may not
    revoke itself (its own request would cut it off halfway through, and a
    typo of its own name would lock its workstation out); another
    administrator's controller or a shell on the main does it."""
    rec = store.find_controller(name)
    if rec is None:
        raise RevokeRefused(404, f"no active controller {name!r}")
    if caller_id is not None and rec.id == caller_id:
        raise RevokeRefused(
            409,
            f"controller {rec.name} is the one asking: a controller does not revoke itself. "
            "Revoke it from another administrator's controller or from a shell on the main. "
            "Nothing changed.",
        )
    with store.transaction():
        store.revoke_controller(rec.id)
        store.append_audit(actor, "auth.controller.revoke", "ok", role=actor_role, target=rec.name)
    return rec


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
