"""Which certificate this node presents, and its SHA-256 fingerprint, with the
standard library alone: `letsinfer status` shows it on every call without
loading a cryptography library. The same digest as ``pki.fingerprint``."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from letsinfer.home import Home
from letsinfer.identity import NodeIdentity


def presented_cert(home: Home, identity: NodeIdentity) -> Path:
    """Its cluster certificate once enrolled, its pairing certificate before."""
    if identity.enrolled and identity.cluster:
        return home.cluster_dir(identity.cluster) / "node.crt"
    return home.pairing_cert


def pem_fingerprint(pem: str) -> str:
    """SHA-256 of the first certificate's DER bytes in ``pem``."""
    body = pem.split("-----BEGIN CERTIFICATE-----", 1)[1].split("-----END CERTIFICATE-----", 1)[0]
    return hashlib.sha256(base64.b64decode("".join(body.split()))).hexdigest()


def file_fingerprint(path: Path) -> str | None:
    """The certificate's fingerprint, or None when it is not there (yet)."""
    try:
        return pem_fingerprint(path.read_text())
    except (OSError, IndexError, ValueError):
        return None
