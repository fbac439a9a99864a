"""An engine binary's identity: which file, by its bytes.

A llama-server runtime release records its binary's sha256 and ``--version``
output when it is made (on the main). A node runs the release only while the
file at that path still has those bytes: replacing the binary is a new
release, never new code under an old one. What this does not cover: someone
who can write the binary can also swap it between the check and the start
(root on the node is out of scope, as for the audit anchor).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_VERSION_TIMEOUT_S = 20.0


class BinaryError(Exception):
    """The binary is missing, unreadable, or not the one released; nothing runs."""


@dataclass(frozen=True)
class BinaryIdentity:
    path: str  # absolute: the one file a release names
    sha256: str
    version: str  # its `--version` output, one line


def resolve(binary: str) -> Path:
    """An absolute path: a bare name is looked up on PATH, as a shell would."""
    found = shutil.which(binary) if os.sep not in binary else binary
    if found is None:
        raise BinaryError(f"{binary}: not found on PATH")
    path = Path(found).absolute()
    if not path.is_file():
        raise BinaryError(f"{path}: no such file")
    if not os.access(path, os.X_OK):
        raise BinaryError(f"{path}: not executable")
    return path


# Hashing a large binary at every engine start would cost seconds: the digest
# is kept while the file's inode, size and times are unchanged (any write or
# replacement changes the change time, which no user can set).
_digests: dict[tuple[str, int, int, int, int, int], str] = {}


def sha256_of(path: Path) -> str:
    try:
        st = path.stat()
        key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key in _digests:
            return _digests[key]
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise BinaryError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    _digests[key] = digest.hexdigest()
    return _digests[key]


def identify(binary: str) -> BinaryIdentity:
    """The binary's path, sha256 and ``--version`` output (it must answer it)."""
    path = resolve(binary)
    digest = sha256_of(path)
    try:
        done = subprocess.run(
            [str(path), "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BinaryError(f"{path} --version did not answer: {exc}") from exc
    said = " ".join((done.stdout + " " + done.stderr).split())
    if done.returncode != 0:
        raise BinaryError(f"{path} --version failed (exit {done.returncode}): {said[:200]}")
    return BinaryIdentity(str(path), digest, said[:200] or "unknown")


def check_bytes(path: str, released: str | None, what: str) -> None:
    """Raise BinaryError unless the file at ``path`` still has the ``released``
    sha256; ``what`` names the release in the message."""
    again = (
        "Release it again: `letsinfer model install MODEL --node NODE --replace-existing` "
        "releases the binary as it is now"
    )
    if not released:
        raise BinaryError(
            f"{what} records no sha256 of its binary {path} (it was made before releases "
            f"were bound to bytes). {again}"
        )
    try:
        now = sha256_of(resolve(path))
    except BinaryError as exc:
        raise BinaryError(f"{what}: {exc}. {again}") from exc
    if now != released:
        raise BinaryError(
            f"the binary {path} changed since {what} was made: "
            f"released sha256:{released}, now sha256:{now}. {again}"
        )
