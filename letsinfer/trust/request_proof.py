"""What an enrollment request proves about its sender, and its check.

A request names a main, an address and an expiry in words its sender chose,
and carries the cluster CA certificate, which is public. So the main signs the
request with its node key and sends its node certificate along: the candidate
accepts a request only when that certificate was issued by the request's CA
to a main with the request's main id, and its key signed exactly this request
for exactly this candidate. A LAN host holding the CA certificate, but not the
main's key, cannot make one.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.trust import pki

_CONTEXT = b"letsinfer enrollment request v1\x00"


class RequestProofError(Exception):
    """A request does not prove the main's key; the message says why."""


def message(
    *,
    enrollment_id: str,
    candidate_id: str,
    main_id: str,
    main_name: str,
    main_address: str,
    ca_pem: str,
    token: str,
    expires_at: float,
    gateway_url: str | None,
) -> bytes:
    """The signed bytes: every field the candidate acts on, and the candidate."""
    if not math.isfinite(expires_at):
        raise RequestProofError("the request's expiry is not a time")
    fields = {
        "enrollment_id": enrollment_id,
        "candidate_id": candidate_id,
        "main_id": main_id,
        "main_name": main_name,
        "main_address": main_address,
        "ca_sha256": pki.fingerprint(pki.load_cert(ca_pem.encode())),
        "token": token,
        "expires_at": repr(float(expires_at)),
        "gateway_url": gateway_url,
    }
    return _CONTEXT + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def sign(key: ec.EllipticCurvePrivateKey, body: bytes) -> str:
    return base64.b64encode(key.sign(body, ec.ECDSA(hashes.SHA256()))).decode()


def verify(
    body: bytes, *, main_cert_pem: str | None, signature: str | None, ca_pem: str, main_id: str
) -> None:
    """Raise RequestProofError unless the main ``main_id`` of the cluster of
    ``ca_pem`` signed ``body`` with the key of ``main_cert_pem``."""
    if not main_cert_pem or not signature:
        raise RequestProofError("it carries no signature by the main's node key")
    try:
        cert = pki.load_cert(main_cert_pem.encode())
        pki.verify_issued_by(cert, pki.load_cert(ca_pem.encode()))
        who = pki.identity_of(cert)
    except (pki.CertificateError, ValueError) as exc:
        raise RequestProofError(f"its main certificate is not the cluster's: {exc}") from exc
    if who.kind != "node" or who.role != "main" or who.id != main_id:
        raise RequestProofError(
            f"its certificate is {who.kind} {who.id} ({who.role}), not the main {main_id}"
        )
    if who.not_after < dt.datetime.now(dt.UTC):
        raise RequestProofError("its main certificate has expired")
    public_key = cert.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise RequestProofError("its main certificate has no P-256 key")
    try:
        raw = base64.b64decode(signature, validate=True)
        public_key.verify(raw, body, ec.ECDSA(hashes.SHA256()))
    except (ValueError, InvalidSignature) as exc:
        raise RequestProofError("its signature is not the main's over this request") from exc
