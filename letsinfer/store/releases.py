"""Runtime releases' SQL, the artifacts that models and releases hold, and
the history of the releases each group ran.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import json
import time
from typing import Any

from letsinfer.store.plumbing import Plumbing
from letsinfer.store.records import ArtifactReference, ReleaseHistoryRecord


class ReleaseTables(Plumbing):
    def ensure_release(
        self,
        release_id: str,
        engine: str,
        version: str,
        target: str,
        artifacts: dict[str, str],
        launch: dict[str, Any],
        signature: str | None = None,
    ) -> None:
        """Record a release once; an id never changes meaning."""
        self.db.execute(
            "INSERT OR IGNORE INTO runtime_releases"
            "(id, engine, version, target, artifacts, launch, signature, created_at) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (
                release_id,
                engine,
                version,
                target,
                json.dumps(artifacts, sort_keys=True),
                json.dumps(launch, sort_keys=True),
                signature,
                time.time(),
            ),
        )

    def get_release(self, release_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM runtime_releases WHERE id = ?", (release_id,))
        return _release(rows[0]) if rows else None

    def list_releases(self) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM runtime_releases ORDER BY created_at, id")
        return [_release(r) for r in rows]

    def list_artifact_references(self) -> list[ArtifactReference]:
        """Every artifact digest a model service or a runtime release needs."""
        rows = self._rows(
            "SELECT artifact_digest AS digest, 'model service' AS holder_kind, name AS holder "
            "FROM model_services WHERE external IS NULL UNION ALL "
            "SELECT artifact_digest, 'LoRA adapter', name FROM model_adapters UNION ALL "
            "SELECT DISTINCT artifact_digest, 'kept weights', service FROM weight_history "
            "UNION ALL "
            "SELECT j.value, 'runtime release', r.id "
            "FROM runtime_releases r, json_each(r.artifacts) j ORDER BY 1, 2, 3"
        )
        return [ArtifactReference(**r) for r in rows]

    def add_release_history(
        self, service: str, node_id: str, pg_id: str, release_id: str, event: str
    ) -> None:
        self.db.execute(
            "INSERT INTO release_history(service, node_id, pg_id, release_id, event, at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (service, node_id, pg_id, release_id, event, time.time()),
        )

    def release_history(self, service: str) -> list[ReleaseHistoryRecord]:
        rows = self._rows(
            "SELECT * FROM release_history WHERE service = ? ORDER BY seq", (service,)
        )
        return [ReleaseHistoryRecord(**r) for r in rows]


def _release(row: dict[str, Any]) -> dict[str, Any]:
    """A release's row with its artifacts and launch decoded."""
    row["artifacts"] = json.loads(row["artifacts"])
    row["launch"] = json.loads(row["launch"])
    return row
