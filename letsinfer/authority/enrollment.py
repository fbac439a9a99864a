"""The main's side of enrollment: a pinned request out, a CSR back, a certificate issued.

The request carries a one-time token. Completion needs that token, an
unexpired pending request, and a CSR whose key is exactly the key the main
pinned when it reached the candidate. Every refusal is audited.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from letsinfer.store import AuthorityStore, EnrollmentRecord, StoreError
from letsinfer.trust import pki
from letsinfer.trust.material import ClusterCA


class EnrollmentRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Offer:
    record: EnrollmentRecord
    token: str


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def open_offer(
    store: AuthorityStore,
    candidate_id: str,
    name: str,
    address: str,
    pubkey_sha256: str,
    ttl_s: float,
) -> Offer:
    if store.find_node(candidate_id) is not None or store.find_node(name) is not None:
        raise StoreError(f"a node named {name!r} or with id {candidate_id} is already enrolled")
    gone = store.get_node(candidate_id)
    if gone is not None:  # removed: its row stays for the record, its identity never returns
        raise StoreError(
            f"node id {candidate_id} ({gone.name}) was removed from this cluster; a removed "
            "identity is never enrolled again: wipe that host and `letsinfer node init` it "
            "(a new identity), then enroll it, under the same name if you like"
        )
    token = secrets.token_urlsafe(32)
    with store.transaction():
        rec = store.add_enrollment(
            f"enr-{uuid.uuid4().hex[:12]}",
            candidate_id,
            name,
            address,
            pubkey_sha256,
            _digest(token),
            ttl_s,
        )
        store.append_audit(
            "cli", "node.enroll.request", "ok", role="main", target=f"{name} ({address})"
        )
    return Offer(rec, token)


def close_offer(store: AuthorityStore, enrollment_id: str, state: str, detail: str) -> None:
    with store.transaction():
        store.set_enrollment_state(enrollment_id, state, detail)
        store.append_audit(
            "cli", "node.enroll.request", "denied", role="main", target=enrollment_id, detail=detail
        )


def complete(
    store: AuthorityStore,
    ca: ClusterCA,
    enrollment_id: str,
    token: str,
    csr_pem: str,
    agent_address: str | None,
    refused: Callable[[str], None],
) -> tuple[EnrollmentRecord, bytes]:
    """Check everything, then record the node and issue its certificate in one
    step. ``refused(reason)`` counts a refusal for the audit chain (anyone may
    ask: a flood of bad tokens must not write a record each)."""
    rec = store.get_enrollment(enrollment_id)

    def refuse(status: int, why: str, kind: str | None = None) -> EnrollmentRefused:
        refused(kind or why)
        return EnrollmentRefused(status, why)

    if rec is None:
        raise refuse(404, "no such enrollment request")
    if not hmac.compare_digest(rec.token_digest, _digest(token)):
        raise refuse(403, "wrong enrollment token")
    if rec.state != "pending":
        raise refuse(409, f"this enrollment request is {rec.state}")
    if time.time() > rec.expires_at:
        store.set_enrollment_state(rec.id, "expired")
        raise refuse(410, "this enrollment request has expired; run `letsinfer node add` again")
    try:
        csr = pki.load_csr(csr_pem.encode())
    except pki.CertificateError as exc:
        raise refuse(400, str(exc), "malformed certificate request") from exc
    if pki.public_key_fingerprint(csr.public_key()) != rec.pubkey_sha256:  # type: ignore[arg-type]
        raise refuse(403, "the CSR's key is not the key the main pinned for this candidate")
    cert_pem = ca.issue_node(csr.public_key(), rec.candidate_id)  # type: ignore[arg-type]
    fp = pki.fingerprint(pki.load_cert(cert_pem))
    with store.transaction():
        try:
            store.add_node(rec.candidate_id, rec.name, "child", agent_address or rec.address, fp)
        except StoreError as exc:
            raise refuse(409, str(exc), "the node cannot be added") from exc
        store.set_enrollment_state(rec.id, "accepted")
        store.append_audit(
            f"node:{rec.candidate_id}", "node.enroll.complete", "ok", role="child", target=rec.name
        )
    return rec, cert_pem
