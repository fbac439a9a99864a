"""Where a node's keys and certificates live, and making them.

Layout under the home's etc: ``pki/node.key`` (this node's key, for life),
``pki/pairing.crt`` (self-signed; what discovery pins before enrollment),
``clusters/<ca-fp>/{ca.crt,node.crt}`` (per cluster), ``ca/ca.key`` (main only).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.trust import pki
from letsinfer.trust.presented import presented_cert


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path | None  # None: not enrolled (pairing certificate, no CA)


def ensure_node_key(home: Home) -> ec.EllipticCurvePrivateKey:
    if home.node_key.exists():
        return pki.read_private_key(home.node_key)
    key = pki.new_key()
    pki.write_private_key(home.node_key, key)
    return key


def ensure_pairing_cert(home: Home, node_id: str) -> Path:
    key = ensure_node_key(home)
    if not home.pairing_cert.exists():
        pki.write_pem(home.pairing_cert, pki.cert_pem(pki.self_signed(node_id, key)))
    return home.pairing_cert


def tls_files(home: Home, identity: NodeIdentity) -> TlsFiles:
    """The certificate this node presents now: its cluster certificate once
    enrolled, its pairing certificate before."""
    cert = presented_cert(home, identity)
    if identity.enrolled and identity.cluster:
        return TlsFiles(cert=cert, key=home.node_key, ca=cert.parent / "ca.crt")
    return TlsFiles(cert=ensure_pairing_cert(home, identity.node_id), key=home.node_key, ca=None)


def presented_fingerprint(home: Home, identity: NodeIdentity) -> str:
    return pki.fingerprint(pki.load_cert(tls_files(home, identity).cert.read_bytes()))


def init_main_pki(home: Home, node_id: str) -> str:
    """Make the cluster CA and the main's node certificate; return the CA fingerprint."""
    ca_key, ca_cert = pki.create_ca(node_id)
    cluster = pki.fingerprint(ca_cert)
    node_key = ensure_node_key(home)
    ensure_pairing_cert(home, node_id)
    pki.write_private_key(home.ca_key, ca_key)
    d = home.cluster_dir(cluster)
    pki.write_pem(d / "ca.crt", pki.cert_pem(ca_cert))
    cert = pki.issue(
        ca_key,
        ca_cert,
        node_key.public_key(),
        kind="node",
        subject_id=node_id,
        role="main",
        days=pki.NODE_CERT_DAYS,
    )
    pki.write_pem(d / "node.crt", pki.cert_pem(cert))
    return cluster


class ClusterCA:
    """The main's certificate authority (only the main holds its key)."""

    def __init__(self, home: Home, identity: NodeIdentity) -> None:
        assert identity.cluster is not None
        self.key = pki.read_private_key(home.ca_key)
        self.cert_path = home.cluster_dir(identity.cluster) / "ca.crt"
        self.cert = pki.load_cert(self.cert_path.read_bytes())
        self.fingerprint = identity.cluster

    @property
    def pem(self) -> str:
        return pki.cert_pem(self.cert).decode()

    def issue_node(
        self, public_key: ec.EllipticCurvePublicKey, node_id: str, role: str = "child"
    ) -> bytes:
        cert = pki.issue(
            self.key,
            self.cert,
            public_key,
            kind="node",
            subject_id=node_id,
            role=role,
            days=pki.NODE_CERT_DAYS,
        )
        return pki.cert_pem(cert)

    def issue_controller(
        self, public_key: ec.EllipticCurvePublicKey, controller_id: str, role: str
    ) -> bytes:
        cert = pki.issue(
            self.key,
            self.cert,
            public_key,
            kind="controller",
            subject_id=controller_id,
            role=role,
            days=pki.CONTROLLER_CERT_DAYS,
        )
        return pki.cert_pem(cert)
