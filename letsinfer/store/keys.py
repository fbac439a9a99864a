"""API keys' SQL: each key's digest, the models it may use, and its policy
(band, rate limits, budget, response cache).

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from letsinfer.store.plumbing import Plumbing
from letsinfer.store.records import ApiKeyRecord, StoreError, _key

# What `auth key limits` may change on a key, and the store's column for each.
KEY_POLICY_FIELDS = (
    "band",
    "rpm",
    "tpm",
    "budget_tokens",
    "budget_period",
    "cache_ttl_s",
    "cache_sampled",
)


class ApiKeyTables(Plumbing):
    def add_api_key(
        self,
        key_id: str,
        name: str,
        digest: str,
        prefix: str,
        models: tuple[str, ...],
        concurrency: int | None,
        policy: dict[str, Any] | None = None,
        owner: str | None = None,
        project: str | None = None,
    ) -> ApiKeyRecord:
        """``policy``: any of KEY_POLICY_FIELDS (band, limits, cache);
        ``owner``, ``project``: the portal account and project it belongs to."""
        try:
            self.db["api_keys"].insert(
                {
                    "id": key_id,
                    "name": name,
                    "digest": digest,
                    "prefix": prefix,
                    "models": json.dumps(list(models)),
                    "concurrency": concurrency,
                    "created_at": time.time(),
                    "revoked_at": None,
                    "owner": owner,
                    "project": project,
                    **_policy_columns(policy or {}),
                }
            )
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"an active API key named {name!r} already exists") from exc
        return self.list_api_keys(include_revoked=True, name=name)[-1]

    def list_api_keys(
        self, include_revoked: bool = False, name: str | None = None
    ) -> list[ApiKeyRecord]:
        sql = "SELECT * FROM api_keys WHERE 1=1"
        params: dict[str, Any] = {}
        if not include_revoked:
            sql += " AND revoked_at IS NULL"
        if name is not None:
            sql += " AND name = :name"
            params["name"] = name
        return [_key(r) for r in self._rows(sql + " ORDER BY created_at", params)]

    def set_key_policy(self, name: str, policy: dict[str, Any]) -> bool:
        """Change an active key's band, limits or cache (KEY_POLICY_FIELDS)."""
        columns = _policy_columns(policy)
        if not columns:
            return bool(self.list_api_keys(name=name))
        sets = ", ".join(f"{k} = :{k}" for k in columns)
        cur = self.db.execute(
            f"UPDATE api_keys SET {sets} WHERE name = :name AND revoked_at IS NULL",
            {**columns, "name": name},
        )
        return cur.rowcount > 0

    def set_key_models(self, name: str, models: tuple[str, ...]) -> bool:
        """Replace an active key's model list (its callers never leave it
        empty: an empty list allows every model)."""
        cur = self.db.execute(
            "UPDATE api_keys SET models = ? WHERE name = ? AND revoked_at IS NULL",
            (json.dumps(list(models)), name),
        )
        return cur.rowcount > 0

    def revoke_api_key(self, name: str) -> bool:
        cur = self.db.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
            (time.time(), name),
        )
        return cur.rowcount > 0


def _policy_columns(policy: dict[str, Any]) -> dict[str, Any]:
    unknown = set(policy) - set(KEY_POLICY_FIELDS)
    if unknown:
        raise StoreError(f"not a key policy field: {', '.join(sorted(unknown))}")
    return {k: int(v) if k == "cache_sampled" else v for k, v in policy.items()}
