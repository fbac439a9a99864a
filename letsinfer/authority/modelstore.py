"""The node's model store: GGUF files kept by content digest.

A file is checked (GGUF magic and a full header/tensor parse), hashed while it
is copied, and only then renamed into place, so a bad file leaves nothing.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from letsinfer.contracts.artifacts import ModelFileError, artifact_path

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Artifact:
    digest: str  # sha256 hex
    size: int
    path: Path


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
