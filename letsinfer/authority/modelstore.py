"""The node's model store: GGUF files kept by content digest.

A file is checked (GGUF magic and a full header/tensor parse), hashed while it
is copied, and only then renamed into place, so a bad file leaves nothing.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"


class ModelFileError(Exception):
    """The file is not a usable model; the message says why."""


@dataclass(frozen=True)
class Artifact:
    digest: str  # sha256 hex
    size: int
    path: Path


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


def check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    import gguf  # parsing needs numpy; import only when a file is checked

    try:
        reader = gguf.GGUFReader(str(path))
        if not reader.tensors:
            raise ModelFileError(f"{path}: GGUF file has no tensors")
    except ModelFileError:
        raise
    except Exception as exc:  # the reader raises many types on corrupt input
        raise ModelFileError(f"{path}: GGUF file is corrupt or truncated ({exc})") from exc


def import_gguf(store_dir: Path, source: Path) -> Artifact:
    """Check ``source`` and copy it into the store under its digest."""
    check_gguf(source)
    target_dir = store_dir / "sha256"
    target_dir.mkdir(parents=True, exist_ok=True)
    tmp = target_dir / f".import-{os.getpid()}-{source.name}.part"
    h = hashlib.sha256()
    size = 0
    try:
        with source.open("rb") as src, tmp.open("wb") as dst:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                dst.write(chunk)
                size += len(chunk)
        final = artifact_path(store_dir, h.hexdigest())
        if final.exists():
            tmp.unlink()
        else:
            tmp.replace(final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Artifact(digest=h.hexdigest(), size=size, path=final)


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
