"""What in the authority still needs a mirror artifact, and what does not.

Removal decisions read both the catalog and the authority; if either cannot
be read the answer is an error, never "nothing is referenced".
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path

from letsinfer.mirror.catalog import ArtifactRecord, Catalog
from letsinfer.mirror.errors import MirrorError
from letsinfer.store.authority import AuthorityStore, StoreError


def authority_references(database: Path) -> dict[str, list[str]]:
    """digest -> who needs it (e.g. "model service 'tiny'")."""
    if not database.is_file():
        raise MirrorError(
            f"cannot read the authority at {database}: it does not exist; "
            "refusing to judge what is referenced"
        )
    try:
        store = AuthorityStore(database)
        try:
            refs = store.list_artifact_references()
        finally:
            store.close()
    except (sqlite3.Error, StoreError) as exc:
        raise MirrorError(
            f"cannot read the authority at {database} ({exc}); refusing to judge what is referenced"
        ) from exc
    out: dict[str, list[str]] = {}
    for ref in refs:
        digest = ref.digest.removeprefix("sha256:")
        out.setdefault(digest, []).append(f"{ref.holder_kind} {ref.holder!r}")
    return out


def unused(catalog: Catalog, references: Mapping[str, list[str]]) -> list[ArtifactRecord]:
    return [a for d, a in sorted(catalog.artifacts.items()) if d not in references]


def resolve(catalog: Catalog, digest_or_prefix: str) -> ArtifactRecord:
    """An artifact by its digest or an unambiguous prefix of at least 8 hex digits."""
    wanted = digest_or_prefix.removeprefix("sha256:").lower()
    if len(wanted) < 8:
        raise MirrorError(f"{digest_or_prefix!r}: give at least 8 hex digits of the sha256")
    matches = [a for d, a in catalog.artifacts.items() if d.startswith(wanted)]
    if not matches:
        raise MirrorError(f"no artifact sha256:{wanted} in the mirror")
    if len(matches) > 1:
        raise MirrorError(f"sha256:{wanted} matches {len(matches)} artifacts; give more digits")
    return matches[0]
