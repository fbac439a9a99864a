"""An installed Python package's identity: its files, by their bytes.

An xllamacpp runtime release records this digest, as a llama-server release
records its binary's sha256: a node runs the release only while the package
it imports still has those bytes, so another build under the same version is
another release, never new code under an old id. The same digest comes from
the wheel before it is installed (``wheel_digest``), so a bundle names the
release its wheel installs. Only the package's own files count: the
``.dist-info`` folder differs with the installer, ``__pycache__`` with every
import, and scripts outside site-packages are not what the engine imports.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path, PurePosixPath

from letsinfer.engines.binary import BinaryError, sha256_of


def _counts(path: PurePosixPath) -> bool:
    top = path.parts[0] if path.parts else ""
    return not (
        ".." in path.parts or top.endswith((".dist-info", ".data")) or "__pycache__" in path.parts
    )


def _digest(files: Iterable[tuple[str, str]]) -> str:
    lines = "".join(f"{name}\0{sha256}\n" for name, sha256 in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def distribution_digest(dist: metadata.Distribution) -> str:
    """sha256 over the package's installed files (path and sha256 of each, sorted)."""
    files = [
        (entry.as_posix(), sha256_of(Path(str(entry.locate()))))
        for entry in dist.files or ()
        if _counts(PurePosixPath(entry.as_posix()))
    ]
    if not files:
        raise BinaryError(f"package {dist.metadata['Name']} lists no installed files (no RECORD)")
    return _digest(files)


def wheel_digest(wheel: Path) -> str:
    """The ``distribution_digest`` the wheel's package will have once installed."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            files = [
                (info.filename, hashlib.sha256(zf.read(info)).hexdigest())
                for info in zf.infolist()
                if not info.is_dir() and _counts(PurePosixPath(info.filename))
            ]
    except (zipfile.BadZipFile, OSError) as exc:
        raise BinaryError(f"{wheel}: not a readable wheel ({exc})") from exc
    if not files:
        raise BinaryError(f"{wheel}: the wheel holds no package files")
    return _digest(files)


def installed(name: str) -> metadata.Distribution:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise BinaryError(f"package {name} is not installed") from None
