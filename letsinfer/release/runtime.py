"""Runtime releases are signed records: an engine runs only under a trusted signature.

A release's digest covers its identity and everything that decides what runs
(engine, version, target, artifact digests, launch template). The main signs
its built-in releases with the cluster's release key, made at init; releases
from a vendor arrive signed by the vendor's key (a bundle). Nodes trust the
cluster key (delivered at enrollment) and the keys in ``[release] trusted_keys``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from letsinfer.engines.releases import Release
from letsinfer.home import Home
from letsinfer.release import keys, signatures
from letsinfer.release.keys import PublicKey


def cluster_key_path(home: Home) -> Path:
    return home.etc / "release" / "cluster-release.key"


def release_digest(r: Release) -> str:
    doc = {
        "id": r.id,
        "engine": r.engine,
        "version": r.version,
        "target": r.target,
        "artifacts": r.artifacts,
        "launch": r.launch,
    }
    return hashlib.sha256(
        json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def ensure_cluster_key(home: Home) -> PublicKey:
    path = cluster_key_path(home)
    if path.exists():
        return keys.load_public(keys.public_key_file(path))
    return keys.generate(path)


def sign(home: Home, r: Release) -> str:
    """The signature (JSON text) the main stores beside a release it records."""
    private = keys.load_private(cluster_key_path(home))
    return signatures.sign_digest(release_digest(r), private).to_json().decode()


def verify(r: Release, signature: str | None, trusted: list[PublicKey]) -> PublicKey:
    """Refuse unsigned, untrusted, forged or altered releases, each with its reason."""
    sig = (
        signatures.Signature.from_json(signature.encode(), f"release {r.id}") if signature else None
    )
    return signatures.require_signer(release_digest(r), sig, trusted, f"runtime release {r.id}")


def trusted_for(
    home: Home, configured: tuple[str, ...], cluster_key: str | None
) -> list[PublicKey]:
    found = signatures.trusted_keys(configured)
    if cluster_key:
        found.append(PublicKey.parse(cluster_key))
    own = keys.public_key_file(cluster_key_path(home))
    if own.exists():
        found.append(keys.load_public(own))
    return found
