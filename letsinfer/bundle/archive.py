"""The bundle's tar: written with neutral metadata, read with distrust.

Reading lists every member and refuses, with the member's name and the reason,
anything that is not a plain file at a safe path, any name that appears twice,
and an archive that does not end where a complete tar ends. Nothing is ever
extracted by tarfile itself: callers stream members into names they choose.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from letsinfer.bundle.paths import path_problem
from letsinfer.bundle.progress import Progress

_BLOCK = 512
_CHUNK = 1 << 20


class BundleError(Exception):
    """The bundle was refused; the message says exactly why. Nothing was changed."""


@dataclass(frozen=True)
class Entry:
    """One file to pack: its name in the bundle and where its bytes come from."""

    name: str
    source: Path | bytes


def _tarinfo(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _Reporting(io.RawIOBase):
    """A file reader that reports each chunk read, so packing a large model shows progress."""

    def __init__(self, fh: BinaryIO, progress: Progress) -> None:
        self._fh = fh
        self._progress = progress

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        self._progress.advance(len(data))
        return data


def _size(entry: Entry) -> int:
    return len(entry.source) if isinstance(entry.source, bytes) else entry.source.stat().st_size


def pack(out: Path, entries: Sequence[Entry], mtime: int, progress: Progress) -> None:
    """Write the tar at ``out`` via a temporary name, so ``out`` is whole or absent."""
    part = out.with_name(f".{out.name}.part")
    progress.start(f"packing {out.name}", sum(_size(e) for e in entries))
    try:
        with (
            part.open("wb") as raw,
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for entry in entries:
                info = _tarinfo(entry.name, _size(entry), mtime)
                if isinstance(entry.source, bytes):
                    tar.addfile(info, _Reporting(io.BytesIO(entry.source), progress))
                    continue
                with entry.source.open("rb") as fh:
                    tar.addfile(info, _Reporting(fh, progress))
        with part.open("rb") as written:  # after tarfile wrote the end-of-archive blocks
            os.fsync(written.fileno())
        part.replace(out)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        progress.finish()


def _member_problem(member: tarfile.TarInfo) -> str | None:
    if member.issym():
        return "is a symbolic link"
    if member.islnk():
        return "is a hard link"
    if member.ischr() or member.isblk():
        return "is a device file"
    if member.isfifo():
        return "is a FIFO"
    if member.isdir():
        return "is a directory entry"
    if member.issparse():
        return "is a sparse file"
    if not member.isreg():
        return "is not a regular file"
    return path_problem(member.name)


def _check_complete(path: Path, tar: tarfile.TarFile, members: Sequence[tarfile.TarInfo]) -> None:
    # tarfile stops quietly at a cut or damaged header after the first one; a
    # complete archive continues with the two zero blocks that end every tar.
    size = path.stat().st_size
    for m in members:
        if m.offset_data + m.size > size:
            raise BundleError(
                f"{path} is truncated: member {m.name!r} runs past the end of the file"
            )
    with path.open("rb") as fh:
        fh.seek(tar.offset)
        marker = fh.read(2 * _BLOCK)
    if len(marker) < 2 * _BLOCK or marker.count(0) != len(marker):
        raise BundleError(
            f"{path} is corrupt or truncated: no valid tar header or end-of-archive marker "
            f"at byte {tar.offset}"
        )


def _data_filter_problem(member: tarfile.TarInfo) -> str | None:
    """A second opinion from the standard library's own rules, where it has them
    (Python 3.11.4 and later; Debian 12's 3.11.2 has not): the checks above
    already refuse everything the data filter refuses."""
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:
        return None
    try:
        data_filter(member, "/nonexistent-bundle-root")
    except tarfile.FilterError as exc:
        return f"is refused by tarfile's data filter ({exc})"
    return None


@contextmanager
def open_bundle(path: Path) -> Iterator[tuple[tarfile.TarFile, dict[str, tarfile.TarInfo]]]:
    """Open ``path`` and yield its checked members by name."""
    with ExitStack() as stack:
        try:
            tar = stack.enter_context(tarfile.open(path, mode="r:"))
        except FileNotFoundError:
            raise BundleError(f"{path}: no such file") from None
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise BundleError(f"{path} is not a tar archive (corrupt or truncated: {exc})") from exc
        try:
            members = tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise BundleError(f"{path} is corrupt or truncated ({exc})") from exc
        _check_complete(path, tar, members)
        by_name: dict[str, tarfile.TarInfo] = {}
        for m in members:
            problem = _member_problem(m) or _data_filter_problem(m)
            if problem:
                raise BundleError(f"bundle member {m.name!r} {problem}; refusing the bundle")
            if m.name in by_name:
                raise BundleError(f"bundle member {m.name!r} appears twice; refusing the bundle")
            by_name[m.name] = m
        yield tar, by_name


def read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> bytes:
    if member.size > limit:
        raise BundleError(f"bundle member {member.name!r} is too large ({member.size} bytes)")
    fh = tar.extractfile(member)
    assert fh is not None  # regular files always have data
    try:
        data = fh.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(f"bundle member {member.name!r} cannot be read ({exc})") from exc
    if len(data) != member.size:
        raise BundleError(f"bundle member {member.name!r} is truncated")
    return data


def copy_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, progress: Progress
) -> tuple[int, str]:
    """Stream a member to ``dest`` (created new, synced); return its size and sha256."""
    fh = tar.extractfile(member)
    assert fh is not None
    h = hashlib.sha256()
    size = 0
    try:
        with dest.open("xb") as out:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
                progress.advance(len(chunk))
            out.flush()
            os.fsync(out.fileno())
    except (tarfile.TarError, EOFError) as exc:
        raise BundleError(f"bundle member {member.name!r} cannot be read ({exc})") from exc
    return size, h.hexdigest()
