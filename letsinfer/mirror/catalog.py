"""The mirror catalog: which artifacts and bundles a node holds.

It is one JSON file replaced atomically (write, fsync, rename), so a reader
sees the catalog before or after a change, never in between. A catalog that
cannot be read is an error, never "empty": decisions about what to delete
must not be made on a guess.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from letsinfer.mirror.layout import MirrorLayout

FORMAT: Final = "letsinfer-mirror-catalog/1"


class CatalogError(Exception):
    """The catalog is missing or unreadable; the message names the file and the reason."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArtifactRecord(_Record):
    digest: str
    size: int
    kind: Literal["wheel", "model", "runtime"]
    names: list[str]  # paths it had in the bundles that brought it
    bundles: list[str]  # ids of those bundles
    imported_at: str


class SourceFileRecord(_Record):
    name: str  # path in the repository
    digest: str
    size: int


class SourceRecord(_Record):
    """A model's hub origin, as the bundle that brought it recorded it."""

    repo: str
    revision: str
    commit: str
    files: list[SourceFileRecord]  # split parts in order


class BundleModelRecord(_Record):
    name: str
    digest: str
    path: str
    source: SourceRecord | None = None


class BundleRecord(_Record):
    id: str
    manifest_sha256: str
    created_at: str
    created_by: str
    imported_at: str
    signer: str  # the signing key's fingerprint
    platforms: list[str]
    python_version: str
    files: dict[str, str]  # path in the bundle -> digest
    models: list[BundleModelRecord] = Field(default_factory=list)
    runtimes: list[str] = Field(default_factory=list)


class Catalog(_Record):
    format: Literal["letsinfer-mirror-catalog/1"] = FORMAT
    artifacts: dict[str, ArtifactRecord] = Field(default_factory=dict)
    bundles: dict[str, BundleRecord] = Field(default_factory=dict)

    def missing_files(self, bundle: BundleRecord) -> list[str]:
        """The bundle's files whose artifacts were removed from the mirror since."""
        return sorted(p for p, d in bundle.files.items() if d not in self.artifacts)


def read_catalog(layout: MirrorLayout) -> Catalog:
    path = layout.catalog_file
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if layout.blobs.exists() and any(layout.blobs.iterdir()):
            raise CatalogError(
                f"cannot read the mirror catalog {path}: it is missing, yet the mirror holds "
                "artifacts"
            ) from None
        return Catalog()
    except OSError as exc:
        raise CatalogError(f"cannot read the mirror catalog {path}: {exc.strerror}") from exc
    try:
        return Catalog.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise CatalogError(
            f"cannot read the mirror catalog {path}: {where}: {first['msg']}"
        ) from exc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_catalog(layout: MirrorLayout, catalog: Catalog) -> None:
    layout.root.mkdir(parents=True, exist_ok=True)
    tmp = layout.root / f".catalog-{os.getpid()}.tmp"
    try:
        with tmp.open("w") as fh:
            json.dump(catalog.model_dump(mode="json"), fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(layout.catalog_file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(layout.root)
