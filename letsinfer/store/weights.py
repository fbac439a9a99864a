"""Weights' SQL (letsinfer.lifecycle.weights): which weights each model ran,
with their origin, which weights a group runs while an update rolls out, and
each model's gate (the suite and score its updates and upgrades must reach).

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from letsinfer.store.plumbing import Plumbing


@dataclass(frozen=True)
class WeightsRecord:
    """One set of weights a model ran (kept for `model rollback --weights`)."""

    seq: int
    service: str
    artifact_digest: str
    artifact_size: int
    origin: dict[str, Any] | None  # repo, revision, commit, files (as `model pull` records)
    event: str  # pulled, updated, rolled back
    at: float

    @property
    def commit(self) -> str | None:
        return None if self.origin is None else self.origin.get("commit")


@dataclass(frozen=True)
class GateRecord:
    service: str
    suite: str  # a built-in suite's name or a suite file's absolute path
    min_score: float
    set_at: float
    set_by: str


def _weights(r: dict[str, Any]) -> WeightsRecord:
    return WeightsRecord(**{**r, "origin": json.loads(r["origin"]) if r["origin"] else None})


class WeightTables(Plumbing):
    def add_weights_history(
        self,
        service: str,
        digest: str,
        size: int,
        origin: dict[str, Any] | None,
        event: str,
    ) -> None:
        self.db.execute(
            "INSERT INTO weight_history (service, artifact_digest, artifact_size, origin, event, "
            "at) VALUES (?, ?, ?, ?, ?, ?)",
            (
                service,
                digest,
                size,
                json.dumps(origin, sort_keys=True) if origin is not None else None,
                event,
                time.time(),
            ),
        )

    def weights_history(self, service: str) -> list[WeightsRecord]:
        """Oldest first."""
        rows = self._rows("SELECT * FROM weight_history WHERE service = ? ORDER BY seq", (service,))
        return [_weights(r) for r in rows]

    def set_pg_weights(self, pg_id: str, digest: str | None) -> None:
        """The group runs these weights from its next generation (None: its model's)."""
        self.db.execute(
            "UPDATE placement_groups SET artifact_digest = ?, updated_at = ? WHERE id = ?",
            (digest, time.time(), pg_id),
        )

    def set_service_weights(
        self, service: str, digest: str, size: int, origin: dict[str, Any] | None
    ) -> None:
        """The model's weights are these now; its groups that named them
        themselves run them as the model's (their override goes)."""
        with self.transaction():
            self.db.execute(
                "UPDATE model_services SET artifact_digest = ?, artifact_size = ?, origin = ? "
                "WHERE name = ?",
                (
                    digest,
                    size,
                    json.dumps(origin, sort_keys=True) if origin is not None else None,
                    service,
                ),
            )
            self.db.execute(
                "UPDATE placement_groups SET artifact_digest = NULL "
                "WHERE service = ? AND artifact_digest = ?",
                (service, digest),
            )

    def get_gate(self, service: str) -> GateRecord | None:
        rows = self._rows("SELECT * FROM model_gates WHERE service = ?", (service,))
        return GateRecord(**rows[0]) if rows else None

    def set_gate(self, service: str, suite: str, min_score: float, by: str) -> None:
        self.db.execute(
            "INSERT INTO model_gates (service, suite, min_score, set_at, set_by) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT(service) DO UPDATE SET suite = excluded.suite, "
            "min_score = excluded.min_score, set_at = excluded.set_at, set_by = excluded.set_by",
            (service, suite, min_score, time.time(), by),
        )

    def clear_gate(self, service: str) -> bool:
        return self.db.execute("DELETE FROM model_gates WHERE service = ?", (service,)).rowcount > 0
