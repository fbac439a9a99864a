"""Removing an artifact nothing needs any more: the catalog first, then the bytes."""

from __future__ import annotations

from collections.abc import Mapping

from letsinfer.mirror.catalog import ArtifactRecord, read_catalog, write_catalog
from letsinfer.mirror.errors import MirrorError
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.mirror.references import resolve


def remove_artifact(
    layout: MirrorLayout, digest_or_prefix: str, references: Mapping[str, list[str]]
) -> ArtifactRecord:
    with layout.locked():
        catalog = read_catalog(layout)
        artifact = resolve(catalog, digest_or_prefix)
        holders = references.get(artifact.digest)
        if holders:
            raise MirrorError(
                f"artifact sha256:{artifact.digest[:12]} is still referenced by "
                f"{', '.join(holders)}; refusing to remove it"
            )
        del catalog.artifacts[artifact.digest]
        # Once the catalog no longer lists it, nothing hands it out; a crash
        # before the unlinks below leaves only unlisted bytes.
        write_catalog(layout, catalog)
        for bundle_id in artifact.bundles:
            bundle = catalog.bundles.get(bundle_id)
            if bundle is None:
                continue
            for path, digest in bundle.files.items():
                if digest == artifact.digest:
                    (layout.bundle_dir(bundle_id) / path).unlink(missing_ok=True)
        layout.blob(artifact.digest).unlink(missing_ok=True)
    return artifact
