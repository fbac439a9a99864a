"""Model files in a node's store, kept by content digest: where one lies, and
whether its bytes are still the ones named. The main writes its store; a
child fetches into its own by digest and checks before it runs an engine."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


class ModelFileError(Exception):
    """The file is not a usable model; the message says why."""


def artifact_path(store_dir: Path, digest: str) -> Path:
    return store_dir / "sha256" / f"{digest}.gguf"


def present_digests(store_dir: Path, limit: int = 256) -> list[str]:
    """Digests of the artifacts this store holds (a node reports them with its facts)."""
    try:
        names = sorted(os.listdir(store_dir / "sha256"))
    except OSError:
        return []
    found = [n[:-5] for n in names if n.endswith(".gguf") and len(n) == 69]
    return found[:limit]


def verify_artifact(store_dir: Path, digest: str) -> Path:
    """Return the artifact's path after checking its bytes still match."""
    path = artifact_path(store_dir, digest)
    if not path.is_file():
        raise ModelFileError(f"artifact sha256:{digest} is missing from the model store")
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    if h.hexdigest() != digest:
        raise ModelFileError(f"artifact sha256:{digest} is corrupt (its bytes changed)")
    return path
