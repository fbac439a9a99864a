"""Where a pull's bytes come from: the hub, or the node's mirror. Both hand back
a file whose sha256 was just checked against the one the hub published.

The hub's bytes go to ``<var>/downloads/<sha256>.part`` and stay there between
attempts, so an interrupted pull resumes; once whole they are hashed, and a
mismatch removes them. The mirror's bytes were verified when their bundle was
imported and are hashed again before use (a changed file is refused).
"""

from __future__ import annotations

import fcntl
import hashlib
from pathlib import Path
from typing import Protocol

from letsinfer.bundle.progress import Progress
from letsinfer.hub.choice import RepoFile
from letsinfer.hub.client import HubClient, HubError, Snapshot
from letsinfer.mirror.catalog import read_catalog
from letsinfer.mirror.layout import MirrorLayout


class ChecksumMismatch(HubError):
    """The bytes are not the ones the hub published; nothing of them was kept."""


class Source(Protocol):
    def resolve(self, repo: str, revision: str) -> Snapshot: ...

    def fetch(self, snapshot: Snapshot, file: RepoFile, progress: Progress) -> Path:
        """A local file holding exactly ``file``'s bytes (sha256 checked)."""
        ...

    def done(self, path: Path) -> None:
        """The fetched file was admitted (or refused): drop it if it is ours."""
        ...


def hash_file(path: Path, progress: Progress, description: str) -> str:
    h = hashlib.sha256()
    progress.start(description, path.stat().st_size)
    try:
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
                progress.advance(len(chunk))
    finally:
        progress.finish()
    return h.hexdigest()


class HubSource:
    def __init__(self, client: HubClient, downloads: Path) -> None:
        self.client = client
        self.downloads = downloads

    def resolve(self, repo: str, revision: str) -> Snapshot:
        return self.client.resolve(repo, revision)

    def fetch(self, snapshot: Snapshot, file: RepoFile, progress: Progress) -> Path:
        self.downloads.mkdir(parents=True, exist_ok=True)
        partial = self.downloads / f"{file.sha256}.part"
        # Two pulls of one file at once would interleave their bytes in one partial.
        with (self.downloads / f"{file.sha256}.lock").open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise HubError(
                    f"{file.name}: another pull is downloading it now; try again when it ends"
                ) from None
            # The lock file stays: removing it would let a third pull lock a new
            # file while a second still holds the old one.
            return self._fetch_locked(snapshot, file, partial, progress)

    def _fetch_locked(
        self, snapshot: Snapshot, file: RepoFile, partial: Path, progress: Progress
    ) -> Path:
        self.client.download(snapshot, file, partial, progress)
        size = partial.stat().st_size
        if size != file.size:
            raise HubError(
                f"{file.name}: {size} of {file.size} bytes arrived; run the same pull again "
                "to resume"
            )
        actual = hash_file(partial, progress, f"verifying {file.name}")
        if actual != file.sha256:
            partial.unlink()
            raise ChecksumMismatch(
                f"{file.name}: the bytes received have sha256 {actual}, but the hub publishes "
                f"{file.sha256}; refused, and the download removed"
            )
        return partial

    def done(self, path: Path) -> None:
        path.unlink(missing_ok=True)


class MirrorSource:
    """Models that bundles made with ``bundle create --model REPO@REV`` brought here."""

    def __init__(self, layout: MirrorLayout) -> None:
        self.layout = layout

    def resolve(self, repo: str, revision: str) -> Snapshot:
        catalog = read_catalog(self.layout)
        # The newest import of this repository at this revision (a branch name,
        # or the commit itself) decides the commit; every bundle holding files
        # of that commit contributes them.
        found: list[tuple[str, str, str]] = []  # (imported_at, commit, bundle id)
        for bundle in catalog.bundles.values():
            for m in bundle.models:
                s = m.source
                if s is not None and s.repo == repo and revision in (s.revision, s.commit):
                    found.append((bundle.imported_at, s.commit, bundle.id))
        if not found:
            others = sorted(
                {
                    f"{m.source.revision} ({m.source.commit[:12]})"
                    for b in catalog.bundles.values()
                    for m in b.models
                    if m.source is not None and m.source.repo == repo
                }
            )
            held = f" (it holds {repo} at {', '.join(others)}: pass --revision)" if others else ""
            raise HubError(f"this node's mirror has no {repo}@{revision}{held}")
        _, commit, bundle_id = max(found)
        files: dict[str, RepoFile] = {}
        for bundle in catalog.bundles.values():
            for m in bundle.models:
                s = m.source
                if s is None or s.repo != repo or s.commit != commit:
                    continue
                for f in s.files:
                    if f.digest in catalog.artifacts:  # not removed since
                        files[f.name] = RepoFile(f.name, f.size, f.digest)
        return Snapshot(
            repo, revision, commit, tuple(files.values()), f"mirror (bundle {bundle_id})"
        )

    def fetch(self, snapshot: Snapshot, file: RepoFile, progress: Progress) -> Path:
        path = self.layout.blob(file.sha256)
        if not path.is_file():
            raise HubError(f"{file.name}: sha256:{file.sha256[:12]} is missing from the mirror")
        actual = hash_file(path, progress, f"verifying {file.name}")
        if actual != file.sha256:
            raise ChecksumMismatch(
                f"{file.name}: the mirror's copy has sha256 {actual}, not {file.sha256} "
                "(it was changed after import); refused"
            )
        return path

    def done(self, path: Path) -> None:
        pass  # the mirror keeps its artifacts
