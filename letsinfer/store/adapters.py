"""LoRA adapters' SQL: each a name in the models' namespace, a file in the
model store, and the base model whose groups load it.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any


@dataclass(frozen=True)
class AdapterRecord:
    name: str
    service: str  # the base model
    artifact_digest: str
    artifact_size: int
    source: str | None
    created_at: float
    fallback: str | None = None  # the model that answers when no group that loaded it can


class AdapterTables:
    if TYPE_CHECKING:

        def _rows(
            self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()
        ) -> list[dict[str, Any]]: ...

        def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...

        def check_name_free(self, name: str) -> None: ...

    def add_adapter(
        self, name: str, service: str, digest: str, size: int, source: str | None
    ) -> AdapterRecord:
        # Again here, in the caller's write transaction: a model or adapter
        # added meanwhile under the name (its file took a while to check) wins.
        self.check_name_free(name)
        self._execute(
            "INSERT INTO model_adapters(name, service, artifact_digest, artifact_size, source, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (name, service, digest, size, source, time.time()),
        )
        made = self.get_adapter(name)
        assert made is not None
        return made

    def get_adapter(self, name: str) -> AdapterRecord | None:
        rows = self._rows("SELECT * FROM model_adapters WHERE name = ?", (name,))
        return AdapterRecord(**rows[0]) if rows else None

    def list_adapters(self, service: str | None = None) -> list[AdapterRecord]:
        """In name order: the order a group's engine loads them (their ids)."""
        if service is None:
            rows = self._rows("SELECT * FROM model_adapters ORDER BY name")
        else:
            rows = self._rows(
                "SELECT * FROM model_adapters WHERE service = ? ORDER BY name", (service,)
            )
        return [AdapterRecord(**r) for r in rows]

    def pin_adapters(self, service: str) -> None:
        """Each running group of ``service`` keeps loading the adapters it has now
        (name, file) until it is unpinned or replaced: called in the transaction
        that changes them, so no engine restarts before its turn."""
        now = [[a.name, a.artifact_digest] for a in self.list_adapters(service)]
        self._execute(
            "INSERT OR IGNORE INTO pg_adapter_pins(pg_id, adapters) "
            "SELECT id, ? FROM placement_groups WHERE service = ? AND desired = 'running'",
            (json.dumps(now), service),
        )

    def unpin_adapters(self, pg_ids: list[str]) -> None:
        for pg_id in pg_ids:
            self._execute("DELETE FROM pg_adapter_pins WHERE pg_id = ?", (pg_id,))

    def pinned_adapters(self, pg_id: str) -> tuple[tuple[str, str], ...] | None:
        """What a pinned group loads, (name, digest) in load order; None: its model's."""
        rows = self._rows("SELECT adapters FROM pg_adapter_pins WHERE pg_id = ?", (pg_id,))
        if not rows:
            return None
        return tuple((name, digest) for name, digest in json.loads(rows[0]["adapters"]))

    def set_adapter_fallback(self, name: str, fallback: str | None) -> None:
        self._execute("UPDATE model_adapters SET fallback = ? WHERE name = ?", (fallback, name))

    def delete_adapter(self, name: str) -> None:
        self._execute("DELETE FROM model_adapters WHERE name = ?", (name,))
        # A model that fell back to it answers for itself again (the name
        # must not pass its traffic to whatever takes the name next).
        self._execute("UPDATE model_services SET fallback = NULL WHERE fallback = ?", (name,))
        self._execute("UPDATE model_adapters SET fallback = NULL WHERE fallback = ?", (name,))
