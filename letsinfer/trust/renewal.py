"""Node certificates renewed before they expire, with no restart.

A node certificate lasts ``pki.NODE_CERT_DAYS``. A child asks the main for a
new one over the control plane; the main issues its own with the cluster CA
it holds. Either way the new certificate replaces the file and every running
plane and client that presents it swaps in a context made from it at once
(``peer.reload_certificate``): a node that runs for months keeps talking to
its peers, and a plane never presents a certificate older than the one on
disk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from letsinfer.trust import pki
from letsinfer.trust.material import ClusterCA, TlsFiles
from letsinfer.trust.peer import reload_certificate

if TYPE_CHECKING:  # a child imports this module and runs no authority code
    from letsinfer.store import AuthorityStore

log = logging.getLogger("letsinfer.trust")


def seconds_left(files: TlsFiles) -> float:
    cert = pki.load_cert(files.cert.read_bytes())
    return cert.not_valid_after_utc.timestamp() - time.time()


def due(files: TlsFiles, renew_before_s: float) -> bool:
    return seconds_left(files) <= renew_before_s


def expiry(files: TlsFiles) -> float | None:
    """When the certificate on disk expires (the one the next start presents)."""
    try:
        cert = pki.load_cert(files.cert.read_bytes())
    except (OSError, pki.CertificateError):
        return None
    return cert.not_valid_after_utc.timestamp()


def install(files: TlsFiles, pem: bytes) -> x509.Certificate:
    """Check a renewed certificate (issued by our CA, for our key) and put it
    in place, then renew every context presenting the old one. Raises
    ``pki.CertificateError`` and changes nothing for a certificate that fails."""
    cert = pki.load_cert(pem)
    if files.ca is None:
        raise pki.CertificateError("not enrolled: no cluster CA to check a certificate with")
    pki.verify_issued_by(cert, pki.load_cert(files.ca.read_bytes()))
    ours = pki.read_private_key(files.key).public_key()
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*spki) != ours.public_bytes(*spki):
        raise pki.CertificateError("the renewed certificate is not for this node's key")
    pki.write_pem(files.cert, pki.cert_pem(cert))
    reload_certificate(files.cert)
    return cert


def renew_main(files: TlsFiles, ca: ClusterCA, store: AuthorityStore, node_id: str) -> None:
    """The main's own certificate, issued by the CA it holds."""
    public = pki.read_private_key(files.key).public_key()
    cert = install(files, ca.issue_node(public, node_id, "main"))
    node = store.get_node(node_id)
    with store.transaction():
        store.set_node_fingerprint(node_id, pki.fingerprint(cert))
        store.append_audit(
            f"node:{node_id}",
            "node.certificate.renew",
            "ok",
            role="main",
            target=node.name if node else node_id,
        )
    log.info("node certificate renewed until %s", cert.not_valid_after_utc)


def renew_main_if_due(
    files: TlsFiles,
    ca: Callable[[], ClusterCA],
    store: AuthorityStore,
    node_id: str,
    renew_before_s: float,
) -> bool:
    """Children ask the main for theirs; the main issues its own, on its
    rounds. True when it renewed; a failure is logged (and said by doctor),
    and the next round tries again."""
    try:
        if due(files, renew_before_s):
            renew_main(files, ca(), store, node_id)
            return True
    except Exception:
        log.exception("could not renew this node's certificate")
    return False
