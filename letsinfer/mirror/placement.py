"""Placing a verified bundle into the mirror, so that it appears whole or not at all.

The caller has already checked every byte in a staging folder inside the
mirror (same filesystem, so every move is a rename). Blobs go in first, then
the bundle's tree of hard links, and last the catalog: until the catalog is
replaced nothing lists the new bundle, and an interrupted import leaves only
unlisted files that the next import of the same bundle reuses or replaces.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from letsinfer.bundle.manifest import Manifest
from letsinfer.bundle.paths import MANIFEST_NAME, SIGNATURE_NAME
from letsinfer.mirror.catalog import (
    ArtifactRecord,
    BundleModelRecord,
    BundleRecord,
    Catalog,
    SourceFileRecord,
    SourceRecord,
    read_catalog,
    write_catalog,
)
from letsinfer.mirror.layout import MirrorLayout


@dataclass(frozen=True)
class StagedBundle:
    """A bundle whose files were verified into ``blobs`` (one file per digest)."""

    workdir: Path  # inside the mirror's root
    blobs: dict[str, Path]  # digest -> verified staged file
    manifest: Manifest
    manifest_bytes: bytes
    manifest_sha256: str
    signature_bytes: bytes
    signer: str  # fingerprint of the trusted key that signed the manifest

    @property
    def bundle_id(self) -> str:
        return self.manifest_sha256[:16]


@dataclass(frozen=True)
class Placed:
    bundle: BundleRecord
    path: Path  # the bundle's tree in the mirror
    new_artifacts: int
    new_bytes: int
    already_imported: bool


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _build_tree(layout: MirrorLayout, staged: StagedBundle, tree: Path) -> None:
    for f in staged.manifest.files:
        target = tree / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(layout.blob(f.sha256), target)
    for name, data in (
        (MANIFEST_NAME, staged.manifest_bytes),
        (SIGNATURE_NAME, staged.signature_bytes),
    ):
        (tree / name).write_bytes(data)
        (tree / name).chmod(0o444)


def place_bundle(layout: MirrorLayout, staged: StagedBundle) -> Placed:
    """Move a verified bundle into the mirror. The caller holds ``layout.locked()``."""
    catalog = read_catalog(layout)  # an unreadable catalog stops the import here
    tree = layout.bundle_dir(staged.bundle_id)
    known = catalog.bundles.get(staged.bundle_id)
    if (
        known is not None
        and known.manifest_sha256 == staged.manifest_sha256
        and not catalog.missing_files(known)
    ):
        return Placed(known, tree, 0, 0, already_imported=True)

    layout.blobs.mkdir(parents=True, exist_ok=True)
    moved: list[Path] = []
    previous = staged.workdir / "previous-tree"
    built = staged.workdir / "tree"
    swapped = False
    try:
        new_bytes = 0
        for digest, staged_file in staged.blobs.items():
            if digest in catalog.artifacts and layout.blob(digest).is_file():
                continue  # content-addressed: the same digest is the same bytes
            new_bytes += staged_file.stat().st_size
            staged_file.chmod(0o444)
            os.replace(staged_file, layout.blob(digest))
            moved.append(layout.blob(digest))
        _fsync_dir(layout.blobs)
        _build_tree(layout, staged, built)
        layout.bundles.mkdir(parents=True, exist_ok=True)
        if tree.exists():
            # Left by an interrupted import, or this bundle re-imported after some
            # of its artifacts were removed: it is rebuilt whole.
            tree.rename(previous)
        built.rename(tree)
        swapped = True
        _fsync_dir(layout.bundles)
        placed = _commit(layout, catalog, staged, tree, len(moved), new_bytes)
    except BaseException:
        # Undo in reverse, so the mirror is as it was (the catalog was not replaced).
        if swapped:
            shutil.rmtree(tree, ignore_errors=True)
        if previous.exists():
            previous.rename(tree)
        for blob in moved:
            blob.unlink(missing_ok=True)
        raise
    return placed


def _commit(
    layout: MirrorLayout,
    catalog: Catalog,
    staged: StagedBundle,
    tree: Path,
    new_artifacts: int,
    new_bytes: int,
) -> Placed:
    manifest = staged.manifest
    now = _now()
    by_path = {f.path: f for f in manifest.files}
    for f in manifest.files:
        record = catalog.artifacts.get(f.sha256)
        if record is None:
            record = ArtifactRecord(
                digest=f.sha256, size=f.size, kind=f.kind, names=[], bundles=[], imported_at=now
            )
            catalog.artifacts[f.sha256] = record
        if f.path not in record.names:
            record.names.append(f.path)
        if staged.bundle_id not in record.bundles:
            record.bundles.append(staged.bundle_id)
    bundle = BundleRecord(
        id=staged.bundle_id,
        manifest_sha256=staged.manifest_sha256,
        created_at=manifest.created_at,
        created_by=manifest.created_by,
        imported_at=now,
        signer=staged.signer,
        platforms=list(manifest.target.platforms),
        python_version=manifest.target.python_version,
        files={f.path: f.sha256 for f in manifest.files},
        models=[
            BundleModelRecord(
                name=m.name,
                digest=by_path[m.path].sha256,
                path=m.path,
                source=None
                if m.source is None
                else SourceRecord(
                    repo=m.source.repo,
                    revision=m.source.revision,
                    commit=m.source.commit,
                    files=[
                        SourceFileRecord(
                            name=f.name, digest=by_path[f.path].sha256, size=by_path[f.path].size
                        )
                        for f in m.source.files
                    ],
                ),
            )
            for m in manifest.models
        ],
        runtimes=[r.id for r in manifest.runtimes],
    )
    catalog.bundles[staged.bundle_id] = bundle
    write_catalog(layout, catalog)  # the commit point
    return Placed(bundle, tree, new_artifacts, new_bytes, already_imported=False)


def discard(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
