"""The node's model store: GGUF files kept by content digest.

A file is checked (GGUF magic and a full header/tensor parse), hashed while it
is copied under a temporary name (``.import-<pid>-<name>.part``), and only then
renamed into place, so a bad file leaves nothing. The trial engine that proves
the copy keeps its own files in a folder named the same way (see
:func:`partial_prefix`). Temporary files and folders of a process that was
killed midway are removed at the next node start (:func:`clean_partials`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from letsinfer.contracts.artifacts import ModelFileError, artifact_path

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Artifact:
    digest: str  # sha256 hex
    size: int
    path: Path


def check_gguf(path: Path) -> str:
    """Refuse a file that is not a whole GGUF; return what proves its engine
    serves it: "embedding" when the file declares a pooling type (an
    embedding model), else "completion"."""
    if path.is_dir():
        raise ModelFileError(f"{path}: a directory, not a GGUF file")
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
        pooled = any(name.endswith(".pooling_type") for name in reader.fields)
    except ModelFileError:
        raise
    except Exception as exc:  # the reader raises many types on corrupt input
        raise ModelFileError(f"{path}: GGUF file is corrupt or truncated ({exc})") from exc
    return "embedding" if pooled else "completion"


_PARTIAL = re.compile(r"^\.import-(\d+)-.*\.part$")


def partials_dir(store_dir: Path) -> Path:
    """Where imports stage their temporary files: beside the files they become."""
    return store_dir / "sha256"


def partial_prefix() -> str:
    """How this process's temporary names in the store begin (they end in
    ``.part``): the pid tells :func:`clean_partials` whether they are still in use."""
    return f".import-{os.getpid()}-"


@dataclass
class StagedFile:
    """A checked, hashed copy under a temporary name in the store: commit it
    (rename into place) or discard it."""

    digest: str
    size: int
    path: Path  # the temporary file: what an engine may load to prove it
    final: Path
    kind: str
    created: bool = False  # commit put a new file in place (discard removes it)

    def commit(self) -> Artifact:
        if self.final.exists():
            self.path.unlink(missing_ok=True)
        else:
            self.path.replace(self.final)
            self.created = True
        return Artifact(self.digest, self.size, self.final)

    def discard(self) -> None:
        """Leave the store as it was before staging."""
        self.path.unlink(missing_ok=True)
        if self.created:
            self.final.unlink(missing_ok=True)


def stage_gguf(store_dir: Path, source: Path) -> StagedFile:
    """Check ``source`` and copy it into the store under a temporary name."""
    kind = check_gguf(source)
    target_dir = partials_dir(store_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    tmp = target_dir / f"{partial_prefix()}{source.name}.part"
    h = hashlib.sha256()
    size = 0
    try:
        with source.open("rb") as src, tmp.open("wb") as dst:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                dst.write(chunk)
                size += len(chunk)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return StagedFile(h.hexdigest(), size, tmp, artifact_path(store_dir, h.hexdigest()), kind)


def clean_partials(store_dir: Path) -> list[Path]:
    """Remove temporary import files and folders whose process is gone (killed
    midway); returns what was removed. Those of a live process (an import under
    way) stay."""
    removed = []
    for path in partials_dir(store_dir).glob(".import-*.part"):
        found = _PARTIAL.match(path.name)
        if found is None or Path(f"/proc/{found.group(1)}").exists():
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed
