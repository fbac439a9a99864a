"""``node cleanup``: free what this node's home holds that nothing needs.

What it may free, each with why that is safe:
- the model file of placement groups that are all stopped on this node (the
  next ``model start`` downloads and verifies the exact file again), or of no
  model or group on this node at all; never a file a running group uses, nor,
  on the main, the source file of a model (nodes fetch it there);
- the engine log of a placement group that no longer exists on this node.

The review is computed and acted on in one step. Every file is removed through
folder descriptors opened without following links, from the home's own
folders down, and only if it is still the very file reviewed (device, inode):
a link is never followed and nothing outside the home is ever touched.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import asdict, dataclass
from typing import Any

from letsinfer.home import Home
from letsinfer.storage.usage import engine_logs, model_uses, parts, scan
from letsinfer.storage.uses import NodeUses


@dataclass(frozen=True)
class Release:
    path: str  # relative to the home
    bytes: int
    dev: int
    ino: int
    why: str

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["dev"], data["ino"]
        return data


def review(home: Home, uses: NodeUses) -> list[Release]:
    found = scan(home)
    files = {f.path: f for f in found.files}
    out = []
    for m in model_uses(home, found, uses):
        if m.releasable:
            f = files[m.path]
            out.append(Release(m.path, m.bytes, f.dev, f.ino, m.why))
    for log in engine_logs(found, uses):
        if not log["group_exists"]:
            f = files[log["path"]]
            why = f"placement group {log['pg_id']} no longer exists on this node"
            out.append(Release(f.path, f.bytes, f.dev, f.ino, why))
    return out


def free(home: Home, releases: list[Release]) -> list[Release]:
    """Remove the reviewed files; returns those removed."""
    return [r for r in releases if _unlink_within(home, r)]


def _unlink_within(home: Home, release: Release) -> bool:
    label, *folders, name = release.path.split("/")
    root = dict(parts(home)).get(label)
    if root is None or not folders or any(p in ("", ".", "..") for p in [*folders, name]):
        return False
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fds: list[int] = []
    try:
        fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY))
        for folder in folders:
            fds.append(os.open(folder, flags, dir_fd=fds[-1]))
        st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (release.dev, release.ino):
            return False  # not the file reviewed any more
        os.unlink(name, dir_fd=fds[-1])
        return True
    except OSError:
        return False
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def summary(releases: list[Release], freed: list[Release] | None) -> dict[str, Any]:
    return {
        "review": [r.to_json() for r in releases],
        "bytes": sum(r.bytes for r in releases),
        "applied": freed is not None,
        "freed": [r.to_json() for r in freed or []],
        "freed_bytes": sum(r.bytes for r in freed or []),
    }
