"""``model pull``: from a repository name to one verified GGUF file and its origin.

The hub is asked first (unless ``[hub] enabled = false``); when it cannot be
reached, the node's mirror answers the same request. The result is a file
ready for the model store's one admission path, with the origin (repo,
revision, commit, and each file's published sha256) to record beside it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from letsinfer.bundle.progress import Progress
from letsinfer.hub.choice import ModelFiles, choose
from letsinfer.hub.client import HubError, HubUnreachable, Snapshot
from letsinfer.hub.sources import Source
from letsinfer.hub.splits import merge_split


@dataclass(frozen=True)
class PullRequest:
    repo: str
    revision: str = "main"
    file: str | None = None
    quant: str | None = None

    def default_name(self) -> str:
        """``org/name``, with ``:QUANT`` (or ``:file-stem``) when one was asked for."""
        if self.quant:
            return f"{self.repo}:{self.quant}"
        if self.file:
            stem = self.file.rpartition("/")[2].removesuffix(".gguf")
            return f"{self.repo}:{stem}"
        return self.repo


@dataclass(frozen=True)
class Located:
    source: Source
    snapshot: Snapshot
    model: ModelFiles
    hub_skipped: str | None  # why the mirror answered instead of the hub

    def origin(self) -> dict[str, Any]:
        s = self.snapshot
        return {
            "repo": s.repo,
            "revision": s.revision,
            "commit": s.commit,
            "files": [
                {"name": f.name, "sha256": f.sha256, "size": f.size} for f in self.model.parts
            ],
            "via": s.where,
        }


def locate(request: PullRequest, hub: Source | None, mirror: Source) -> Located:
    """The snapshot and the model the request names, from the hub or else the mirror."""
    skipped = "the hub is off ([hub] enabled = false)"
    if hub is not None:
        try:
            snapshot = hub.resolve(request.repo, request.revision)
            model = choose(request.repo, snapshot.files, file=request.file, quant=request.quant)
            return Located(hub, snapshot, model, None)
        except HubUnreachable as exc:
            skipped = str(exc)
    try:
        snapshot = mirror.resolve(request.repo, request.revision)
    except HubError as exc:
        raise HubError(f"{skipped}, and {exc}") from exc
    model = choose(request.repo, snapshot.files, file=request.file, quant=request.quant)
    return Located(mirror, snapshot, model, skipped)


@contextlib.contextmanager
def fetched(located: Located, work: Path, progress: Progress) -> Iterator[Path]:
    """Every part fetched and verified (a split joined into one file): the path
    is valid inside the block; afterwards what the pull made is removed."""
    paths: list[Path] = []
    joined: Path | None = None
    admitted = False
    try:
        for part in located.model.parts:
            paths.append(located.source.fetch(located.snapshot, part, progress))
        if len(paths) == 1:
            yield paths[0]
        else:
            work.mkdir(parents=True, exist_ok=True)
            joined = work / f".join-{os.getpid()}-{located.snapshot.commit[:12]}.gguf"
            yield merge_split(paths, joined, progress)
        admitted = True
    finally:
        if joined is not None:
            joined.unlink(missing_ok=True)
        if admitted:
            # Verified bytes are kept after a failure elsewhere only so that the
            # next pull need not fetch them again; once admitted they are spare.
            for path in paths:
                located.source.done(path)
