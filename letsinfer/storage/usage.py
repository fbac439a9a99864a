"""``node usage``: what this node's home holds, by kind, model and placement group.

Only the home is counted (its etc, var and run folders). A symbolic link is
listed with where it points and never followed; a folder holding another
node's home is named and not entered. A hard link is counted once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from letsinfer.home import Home
from letsinfer.storage.uses import NodeUses

_ARTIFACT = re.compile(r"var/models/sha256/([0-9a-f]{64})\.gguf")
_ENGINE_LOG = re.compile(r"var/logs/engines/([A-Za-z0-9][A-Za-z0-9._-]*)\.log")

KINDS = (
    "models",
    "mirror",
    "engine logs",
    "logs",
    "engine runtime",
    "authority",
    "config",
    "other",
)


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the home: etc/..., var/..., run/...
    bytes: int
    dev: int
    ino: int


@dataclass(frozen=True)
class Scan:
    files: list[Entry]
    symlinks: list[tuple[str, str]]  # (path, where it points): never followed
    other_homes: list[str]  # folders holding another node's home: never entered


def parts(home: Home) -> list[tuple[str, Path]]:
    return [("etc", home.etc), ("var", home.var), ("run", home.run)]


def _is_other_home(path: Path) -> bool:
    return (path / "etc" / "node.json").is_file() or (path / "node.json").is_file()


def scan(home: Home) -> Scan:
    files: list[Entry] = []
    links: list[tuple[str, str]] = []
    others: list[str] = []
    seen: set[tuple[int, int]] = set()
    for label, root in parts(home):
        for kind, rel, value in _walk(root, label):
            if kind == "link":
                links.append((rel, str(value)))
            elif kind == "home":
                others.append(rel)
            else:
                assert isinstance(value, os.stat_result)
                if (value.st_dev, value.st_ino) in seen:
                    continue  # a hard link to a file already counted (the mirror's trees)
                seen.add((value.st_dev, value.st_ino))
                files.append(Entry(rel, value.st_size, value.st_dev, value.st_ino))
    return Scan(files, links, others)


def _walk(root: Path, label: str) -> Iterator[tuple[str, str, object]]:
    """(kind, relative path, stat or link target) for everything under ``root``,
    without following a link; ``root`` itself is the home's own folder."""
    stack = [(root, label)]
    while stack:
        folder, rel = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in sorted(entries, key=lambda x: x.name):
            path = f"{rel}/{e.name}"
            try:
                if e.is_symlink():
                    yield "link", path, os.readlink(e.path)
                elif e.is_dir(follow_symlinks=False):
                    if _is_other_home(Path(e.path)):
                        yield "home", path, None
                    else:
                        stack.append((Path(e.path), path))
                elif e.is_file(follow_symlinks=False):
                    yield "file", path, e.stat(follow_symlinks=False)
            except OSError:
                continue


def kind_of(path: str) -> str:
    if path.startswith("var/models/"):
        return "models"
    if path.startswith("var/mirror/"):
        return "mirror"
    if path.startswith("var/logs/engines/"):
        return "engine logs"
    if path.startswith("var/logs/"):
        return "logs"
    if path.startswith("run/engines/"):
        return "engine runtime"
    if path.startswith("var/authority.db"):
        return "authority"
    if path.startswith("etc/"):
        return "config"
    return "other"


def open_by_processes(home: Home, paths: list[str]) -> set[str]:
    """Which of ``paths`` (relative to the home) a running process names on its
    command line, as every engine names its model file."""
    absolute = {str(absolute_path(home, p)).encode(): p for p in paths}
    found: set[str] = set()
    if not absolute:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        found |= {rel for raw, rel in absolute.items() if raw in cmdline}
    return found


def absolute_path(home: Home, rel: str) -> Path:
    label, _, rest = rel.partition("/")
    return dict(parts(home))[label] / rest


@dataclass(frozen=True)
class ModelUse:
    digest: str
    path: str
    bytes: int
    in_use: bool
    why: str  # what uses it, or why nothing does
    releasable: bool  # node cleanup may free it
    groups: list[dict[str, Any]]


def model_uses(home: Home, found: Scan, uses: NodeUses) -> list[ModelUse]:
    artifacts = {m.group(1): f for f in found.files if (m := _ARTIFACT.fullmatch(f.path))}
    busy = open_by_processes(home, [f.path for f in artifacts.values()])
    running = uses.running_digests()
    out = []
    for digest, f in sorted(artifacts.items(), key=lambda kv: kv[1].path):
        groups = [g for g in uses.groups if g.digest == digest]
        labels = ", ".join(f"{g.pg_id} ({g.model}, {g.desired})" for g in groups)
        models = sorted({g.model for g in groups})
        if not uses.known:
            in_use, why, free = True, "unknown: this node has not heard from its main yet", False
        elif digest in uses.origins:
            names = ", ".join(uses.origins[digest])
            in_use, why, free = True, f"the source of model(s) {names}; nodes fetch it here", False
        elif digest in running:
            in_use, why, free = True, f"placement group(s) {labels}", False
        elif f.path in busy:
            in_use, why, free = True, "a running process has it open", False
        elif groups:
            start = " / ".join(f"`letsinfer model start {m}`" for m in models)
            in_use, free = False, True
            why = (
                f"placement group(s) {labels} stopped: {start} downloads and verifies it "
                "again before the group serves"
            )
        else:
            in_use, why, free = False, "no model or placement group on this node uses it", True
        out.append(
            ModelUse(
                digest,
                f.path,
                f.bytes,
                in_use,
                why,
                free,
                [
                    {"pg_id": g.pg_id, "model": g.model, "desired": g.desired, "engine": g.engine}
                    for g in groups
                ],
            )
        )
    return out


def engine_logs(found: Scan, uses: NodeUses) -> list[dict[str, Any]]:
    groups = {g.pg_id: g for g in uses.groups}
    out = []
    for f in found.files:
        m = _ENGINE_LOG.fullmatch(f.path)
        if m is None:
            continue
        g = groups.get(m.group(1))
        out.append(
            {
                "pg_id": m.group(1),
                "model": g.model if g else None,
                "path": f.path,
                "bytes": f.bytes,
                "in_use": bool(g and (g.engine or g.desired == "running")),
                "group_exists": g is not None or not uses.known,
            }
        )
    return out


def report(home: Home, uses: NodeUses, node: str) -> dict[str, Any]:
    found = scan(home)
    by_kind = dict.fromkeys(KINDS, 0)
    for f in found.files:
        by_kind[kind_of(f.path)] += f.bytes
    return {
        "node": node,
        "role": uses.role,
        "home": {label: str(root) for label, root in parts(home)},
        "total_bytes": sum(by_kind.values()),
        "by_kind": by_kind,
        "models": [asdict(m) for m in model_uses(home, found, uses)],
        "engine_logs": engine_logs(found, uses),
        "symlinks": [{"path": p, "points_to": t} for p, t in found.symlinks],
        "other_homes": found.other_homes,
    }
