"""Model services' SQL: models, their aliases and fallbacks, and the one
namespace they share with LoRA adapters.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from letsinfer.store.plumbing import Plumbing
from letsinfer.store.records import ServiceRecord, StoreError, _service

if TYPE_CHECKING:
    from letsinfer.store.adapters import AdapterRecord


class ServiceTables(Plumbing):
    if TYPE_CHECKING:

        def get_adapter(self, name: str) -> AdapterRecord | None: ...

    def add_service(
        self,
        name: str,
        artifact_digest: str,
        artifact_size: int,
        fmt: str,
        source: str | None,
        aliases: tuple[str, ...] = (),
        origin: dict[str, Any] | None = None,
        *,
        kind: str = "completion",
        external: dict[str, Any] | None = None,
        fallback: str | None = None,
    ) -> ServiceRecord:
        self.check_new_names(name, aliases)
        self.db["model_services"].insert(
            {
                "name": name,
                "artifact_digest": artifact_digest,
                "artifact_size": artifact_size,
                "format": fmt,
                "source": source,
                "aliases": json.dumps(list(aliases)),
                "created_at": time.time(),
                "origin": json.dumps(origin, sort_keys=True) if origin is not None else None,
                "kind": kind,
                "external": json.dumps(external, sort_keys=True) if external is not None else None,
                "fallback": fallback,
            }
        )
        svc = self.get_service(name)
        assert svc is not None
        return svc

    def get_service(self, name: str) -> ServiceRecord | None:
        rows = self._rows("SELECT * FROM model_services WHERE name = ?", (name,))
        return _service(rows[0]) if rows else None

    def resolve_service(self, name_or_alias: str) -> ServiceRecord | None:
        rows = self._rows(
            "SELECT m.* FROM model_services m WHERE m.name = :n OR EXISTS "
            "(SELECT 1 FROM json_each(m.aliases) WHERE json_each.value = :n)",
            {"n": name_or_alias},
        )
        return _service(rows[0]) if rows else None

    def list_services(self) -> list[ServiceRecord]:
        return [_service(r) for r in self._rows("SELECT * FROM model_services ORDER BY name")]

    def check_new_names(self, name: str, aliases: tuple[str, ...] = ()) -> None:
        """A new model's name and aliases: each given once, none the model's
        own name, and none taken by another model, alias or adapter."""
        seen: set[str] = set()
        for alias in aliases:
            if alias == name:
                raise StoreError(
                    f"alias {alias!r} is the model's own name: clients can already use it"
                )
            if alias in seen:
                raise StoreError(f"alias {alias!r} is given twice")
            seen.add(alias)
        self.check_name_free(name)
        for alias in aliases:
            try:
                self.check_name_free(alias)
            except StoreError as exc:
                raise StoreError(f"alias {alias!r} cannot be given: {exc}") from None

    def check_name_free(self, name: str) -> None:
        """Models, their aliases and LoRA adapters share one namespace: the
        name a client puts in ``model`` picks exactly one of them."""
        holder = self.resolve_service(name)
        if holder is not None and holder.name == name:
            raise StoreError(f"model {name!r} already exists")
        if holder is not None:
            raise StoreError(f"the name {name!r} is already an alias of model {holder.name}")
        adapter = self.get_adapter(name)
        if adapter is not None:
            raise StoreError(
                f"the name {name!r} is already taken by a LoRA adapter of {adapter.service}"
            )

    def set_fallback(self, name: str, fallback: str | None) -> None:
        self.db.execute("UPDATE model_services SET fallback = ? WHERE name = ?", (fallback, name))

    def set_external_desired(self, name: str, desired: str) -> int:
        """``model stop``/``start`` of an external model (it has no groups): its
        record says whether the gateway publishes it. 1 if it changed."""
        svc = self.get_service(name)
        if svc is None or svc.external is None:
            return 0
        external = {k: v for k, v in svc.external.items() if k != "desired"}
        if desired != "running":
            external["desired"] = desired
        if external == svc.external:
            return 0
        self.db.execute(
            "UPDATE model_services SET external = ? WHERE name = ?",
            (json.dumps(external, sort_keys=True), name),
        )
        return 1

    def delete_service(self, name: str) -> None:
        """The model and its placement groups (cascade), and its release history."""
        with self.transaction():
            # A model that fell back to it, or to one of its adapters (they go
            # with it), answers for itself again.
            for table in ("model_services", "model_adapters"):
                self.db.execute(
                    f"UPDATE {table} SET fallback = NULL WHERE fallback = ? OR fallback IN "
                    "(SELECT name FROM model_adapters WHERE service = ?)",
                    (name, name),
                )
            self.db.execute("DELETE FROM placement_groups WHERE service = ?", (name,))
            self.db.execute("DELETE FROM release_history WHERE service = ?", (name,))
            self.db.execute("DELETE FROM model_services WHERE name = ?", (name,))

    def services_using(self, digest: str) -> list[str]:
        rows = self._rows(
            "SELECT name FROM model_services WHERE artifact_digest = ? AND external IS NULL "
            "UNION SELECT name FROM model_adapters WHERE artifact_digest = ? ORDER BY name",
            (digest, digest),
        )
        return [r["name"] for r in rows]
