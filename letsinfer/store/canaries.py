"""Canaries' SQL (letsinfer.lifecycle.canary): per model at most one new
placement group that takes a share of its requests until an operator
promotes or aborts it. Kept here so the split outlives a restart of the main.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from letsinfer.store.plumbing import Plumbing


@dataclass(frozen=True)
class CanaryRecord:
    service: str
    pg_id: str  # the new group taking ``percent`` of the model's requests
    percent: float  # 0 < percent < 100
    kind: str  # what it tries: "release" (model upgrade), or another change's name
    change: str  # what it runs, for people: the release id, or what else changed
    replaces: str | None  # the group it stands in for once promoted (None: an added one)
    started_at: float
    started_by: str


class CanaryTables(Plumbing):
    if TYPE_CHECKING:

        def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...

    def add_canary(self, canary: CanaryRecord) -> None:
        """The caller's transaction (one canary per model: its primary key)."""
        self._execute(
            "INSERT INTO canaries (service, pg_id, percent, kind, change, replaces, "
            "started_at, started_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                canary.service,
                canary.pg_id,
                canary.percent,
                canary.kind,
                canary.change,
                canary.replaces,
                canary.started_at,
                canary.started_by,
            ),
        )

    def get_canary(self, service: str) -> CanaryRecord | None:
        rows = self._rows("SELECT * FROM canaries WHERE service = ?", (service,))
        return CanaryRecord(**rows[0]) if rows else None

    def list_canaries(self) -> list[CanaryRecord]:
        return [CanaryRecord(**r) for r in self._rows("SELECT * FROM canaries ORDER BY service")]

    def delete_canary(self, service: str) -> None:
        self._execute("DELETE FROM canaries WHERE service = ?", (service,))
