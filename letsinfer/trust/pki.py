"""Keys and certificates with ``cryptography``: the cluster CA, node and controller certs.

Private keys are P-256, generated where they are used and never leave that
home (files 0600). Identities ride in the certificate: the subject CN is the
node or controller id, the OU its kind and role, and a URI SAN repeats it
(``urn:letsinfer:node:<id>``, ``urn:letsinfer:controller:<id>``,
``urn:letsinfer:role:<role>``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NODE_CERT_DAYS = 30
CONTROLLER_CERT_DAYS = 365
CA_DAYS = 3650
PAIRING_CERT_DAYS = 3650

ROLES = ("viewer", "operator", "administrator")


class CertificateError(Exception):
    """A certificate or CSR is not acceptable; the message says why."""


@dataclass(frozen=True)
class CertIdentity:
    kind: str  # "node" or "controller"
    id: str
    role: str  # node: main/child; controller: viewer/operator/administrator
    fingerprint: str  # sha256 of the DER certificate, hex
    serial: int
    not_after: dt.datetime


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    tmp.replace(path)


def read_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"{path}: not a P-256 key")
    return key


def write_pem(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def load_cert(data: bytes) -> x509.Certificate:
    try:
        if data.lstrip().startswith(b"-----"):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise CertificateError(f"not a certificate: {exc}") from exc


def fingerprint(cert: x509.Certificate | bytes) -> str:
    der = cert if isinstance(cert, bytes) else cert.public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def normalize_fingerprint(text: str) -> str:
    """A SHA-256 fingerprint as 64 lowercase hex digits, from the forms people
    paste: with or without ``sha256:``, colons, any case. ValueError otherwise."""
    value = text.strip().lower().removeprefix("sha256:").replace(":", "")
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"{text!r} is not a SHA-256 fingerprint (64 hex digits)")
    return value


def public_key_fingerprint(key: ec.EllipticCurvePublicKey | x509.Certificate) -> str:
    pub = key.public_key() if isinstance(key, x509.Certificate) else key
    der = pub.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def _name(cn: str, ou: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "letsinfer"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def create_ca(cluster_id: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = new_key()
    name = _name(f"letsinfer cluster {cluster_id}", "ca")
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def self_signed(node_id: str, key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    """A candidate's pairing certificate: what its mDNS fingerprint pins."""
    name = _name(node_id, "candidate")
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=PAIRING_CERT_DAYS))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(f"urn:letsinfer:node:{node_id}")]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )


def make_csr(key: ec.EllipticCurvePrivateKey, cn: str) -> bytes:
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def load_csr(pem: bytes) -> x509.CertificateSigningRequest:
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError as exc:
        raise CertificateError(f"not a certificate signing request: {exc}") from exc
    if not csr.is_signature_valid:
        raise CertificateError("the CSR's signature does not match its key")
    if not isinstance(csr.public_key(), ec.EllipticCurvePublicKey):
        raise CertificateError("the CSR's key is not a P-256 key")
    return csr


def issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    public_key: ec.EllipticCurvePublicKey,
    *,
    kind: str,
    subject_id: str,
    role: str,
    days: int,
) -> x509.Certificate:
    """Issue a node or controller certificate. The CA chooses the identity; the
    requester only supplies its public key."""
    if kind not in ("node", "controller"):
        raise CertificateError(f"unknown certificate kind {kind!r}")
    now = _now()
    ou = role if kind == "node" else "controller"
    sans: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(f"urn:letsinfer:{kind}:{subject_id}"),
        x509.UniformResourceIdentifier(f"urn:letsinfer:role:{role}"),
    ]
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject_id, ou))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def identity_of(cert: x509.Certificate) -> CertIdentity:
    """Read who a (verified) certificate speaks for."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound as exc:
        raise CertificateError("certificate carries no letsinfer identity") from exc
    kind = subject = role = None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        parts = uri.split(":")
        if len(parts) == 4 and parts[:2] == ["urn", "letsinfer"]:
            if parts[2] in ("node", "controller"):
                kind, subject = parts[2], parts[3]
            elif parts[2] == "role":
                role = parts[3]
    if kind is None or subject is None or role is None:
        raise CertificateError("certificate carries no letsinfer identity")
    return CertIdentity(
        kind=kind,
        id=subject,
        role=role,
        fingerprint=fingerprint(cert),
        serial=cert.serial_number,
        not_after=cert.not_valid_after_utc,
    )


def verify_issued_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> None:
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, Exception) as exc:
        raise CertificateError("certificate was not issued by this cluster's CA") from exc
