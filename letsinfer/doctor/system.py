"""The machine itself: Python, resource limits, free disk. Standard library only."""

from __future__ import annotations

import resource
import shutil
import sys
from pathlib import Path

from letsinfer.doctor.findings import Finding, fail, ok, warn

MIN_PYTHON = (3, 11)
GIB = 1 << 30
MIB = 1 << 20

# Disk under the home: the model store, engine logs and the authority live
# there. Nearly full fails (a model copy or the database's next write breaks);
# less than room for one more model warns.
DISK_FAIL_USED = 0.95
DISK_FAIL_FREE = 100 * MIB
DISK_WARN_USED = 0.85
DISK_WARN_FREE = 4 * GIB

# Open files: the gateway holds two per client connection (client and engine).
NOFILE_FAIL = 1024
NOFILE_WARN = 20_000
# Locked memory: GPU engines pin host memory (CUDA transfers, NCCL/RDMA).
MEMLOCK_WARN = 64 * MIB


def python_version(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Finding:
    said = ".".join(map(str, version))
    if version[:2] < MIN_PYTHON:
        return fail(
            "python",
            f"Python {said} is too old; letsinfer needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+",
            "install Python 3.11 or newer (node_python in the inventory)",
        )
    return ok("python", f"Python {said} ({sys.executable})")


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def open_files(main: bool) -> Finding:
    """The node raises its soft limit to the hard one, so the hard one counts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    said = f"soft {_limit(soft)}, hard {_limit(hard)}"
    fix = "raise the hard limit: LimitNOFILE=65536 in the unit, or nofile in limits.conf"
    if hard != resource.RLIM_INFINITY and hard < NOFILE_FAIL:
        return fail("open files", f"{said}: too few for the node's planes and engines", fix)
    if main and hard != resource.RLIM_INFINITY and hard < NOFILE_WARN:
        cap = max(1, (hard - min(256, hard // 2)) // 2)
        return warn("open files", f"{said}: the gateway holds at most {cap} connections", fix)
    return ok("open files", said)


def locked_memory(has_gpus: bool) -> Finding:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    said = f"soft {_limit(soft)}, hard {_limit(hard)}"
    # CPU engines lock nothing; GPU engines pin host memory (CUDA, NCCL, RDMA).
    if has_gpus and soft != resource.RLIM_INFINITY and soft < MEMLOCK_WARN:
        return warn(
            "locked memory",
            f"{said}: too little for GPU engines (pinned memory, NCCL)",
            "LimitMEMLOCK=infinity in the unit, or memlock unlimited in limits.conf",
        )
    return ok("locked memory", said)


def existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a home not made yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk(path: Path) -> Finding:
    where = existing(path)
    usage = shutil.disk_usage(where)
    used = 1 - usage.free / usage.total if usage.total else 1.0
    said = (
        f"{usage.free / GIB:.2f} GiB free of {usage.total / GIB:.2f} GiB "
        f"({used:.0%} used) under {path}"
    )
    fix = f"free space on the filesystem of {where}, or put the home on a larger one (--home)"
    if used >= DISK_FAIL_USED or usage.free < DISK_FAIL_FREE:
        return fail("disk", f"{said}: nearly full", fix)
    if used >= DISK_WARN_USED or usage.free < DISK_WARN_FREE:
        return warn("disk", f"{said}: little room for models", fix)
    return ok("disk", said)
