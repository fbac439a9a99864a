"""People's SQL (letsinfer.portal, letsinfer.authority.people): accounts
approved on the CLI, the projects that group them and bound their keys, the
portal's server-side sessions, and failed sign-ins (guessing is bounded per
account).

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from letsinfer.store.plumbing import Plumbing
from letsinfer.store.records import ApiKeyRecord, StoreError, _key

PENDING, ACTIVE, SUSPENDED = "pending", "active", "suspended"
# What `project limits` may change on a project, and the store's column for each.
PROJECT_POLICY_FIELDS = ("band", "rpm", "tpm", "budget_tokens", "budget_period")


@dataclass(frozen=True)
class AccountRecord:
    name: str
    password_hash: str
    state: str  # pending (can do nothing) | active | suspended
    project: str | None
    operator: bool  # sees the cluster pages, read-only
    created_at: float


@dataclass(frozen=True)
class ProjectRecord:
    name: str
    models: tuple[str, ...]  # empty: every model
    band: str | None
    rpm: int | None
    tpm: int | None
    budget_tokens: int | None
    budget_period: str | None
    created_at: float


@dataclass(frozen=True)
class SessionRecord:
    account: str
    csrf: str
    expires_at: float


def _account(r: dict[str, Any]) -> AccountRecord:
    return AccountRecord(
        r["name"],
        r["password_hash"],
        r["state"],
        r["project"],
        bool(r["operator"]),
        r["created_at"],
    )


def _project(r: dict[str, Any]) -> ProjectRecord:
    return ProjectRecord(
        r["name"],
        tuple(json.loads(r["models"])),
        r["band"],
        r["rpm"],
        r["tpm"],
        r["budget_tokens"],
        r["budget_period"],
        r["created_at"],
    )


class PeopleTables(Plumbing):
    if TYPE_CHECKING:

        def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...

    # -- accounts -------------------------------------------------------------
    def add_account(self, name: str, password_hash: str) -> bool:
        """A pending account; False: the name is taken."""
        return bool(
            self._execute(
                "INSERT OR IGNORE INTO accounts (name, password_hash, state, created_at) "
                "VALUES (?, ?, 'pending', ?)",
                (name, password_hash, time.time()),
            ).rowcount
        )

    def get_account(self, name: str) -> AccountRecord | None:
        rows = self._rows("SELECT * FROM accounts WHERE name = ?", (name,))
        return _account(rows[0]) if rows else None

    def list_accounts(self) -> list[AccountRecord]:
        return [_account(r) for r in self._rows("SELECT * FROM accounts ORDER BY created_at")]

    def set_account(self, name: str, **fields: Any) -> bool:
        """Change an account's state, project, operator flag or password hash."""
        allowed = {"state", "project", "operator", "password_hash"}
        if not fields or set(fields) - allowed:
            raise StoreError(f"not an account field: {', '.join(sorted(set(fields) - allowed))}")
        sets = ", ".join(f"{k} = :{k}" for k in fields)
        cur = self.db.execute(
            f"UPDATE accounts SET {sets} WHERE name = :name", {**fields, "name": name}
        )
        return cur.rowcount > 0

    def remove_account(self, name: str) -> bool:
        """The account and its sessions; its keys are revoked (the caller's
        transaction)."""
        self._execute(
            "UPDATE api_keys SET revoked_at = ? WHERE owner = ? AND revoked_at IS NULL",
            (time.time(), name),
        )
        self._execute("DELETE FROM sign_in_failures WHERE account = ?", (name,))
        return bool(self._execute("DELETE FROM accounts WHERE name = ?", (name,)).rowcount)

    def unusable_owners(self) -> set[str]:
        """Owners whose keys must be refused: accounts not active, or gone."""
        rows = self._rows(
            "SELECT DISTINCT k.owner AS owner FROM api_keys k LEFT JOIN accounts a "
            "ON a.name = k.owner WHERE k.owner IS NOT NULL AND k.revoked_at IS NULL "
            "AND (a.name IS NULL OR a.state != 'active')"
        )
        return {r["owner"] for r in rows}

    # -- projects -------------------------------------------------------------
    def add_project(self, name: str, models: tuple[str, ...], policy: dict[str, Any]) -> None:
        if self.get_project(name) is not None:
            raise StoreError(f"a project named {name!r} exists already")
        cols = _project_columns(policy)
        self.db["projects"].insert(
            {"name": name, "models": json.dumps(list(models)), "created_at": time.time(), **cols}
        )

    def get_project(self, name: str) -> ProjectRecord | None:
        rows = self._rows("SELECT * FROM projects WHERE name = ?", (name,))
        return _project(rows[0]) if rows else None

    def list_projects(self) -> list[ProjectRecord]:
        return [_project(r) for r in self._rows("SELECT * FROM projects ORDER BY name")]

    def set_project(
        self, name: str, policy: dict[str, Any], models: tuple[str, ...] | None
    ) -> bool:
        cols = _project_columns(policy)
        if models is not None:
            cols["models"] = json.dumps(list(models))
        if not cols:
            return self.get_project(name) is not None
        sets = ", ".join(f"{k} = :{k}" for k in cols)
        cur = self.db.execute(
            f"UPDATE projects SET {sets} WHERE name = :name", {**cols, "name": name}
        )
        return cur.rowcount > 0

    def project_members(self, name: str) -> list[str]:
        rows = self._rows("SELECT name FROM accounts WHERE project = ? ORDER BY name", (name,))
        return [r["name"] for r in rows]

    def project_keys(self, revoked_since: float) -> list[tuple[str, str, float | None]]:
        """(project, key name, revoked at or None) of each key in a project,
        live or revoked since ``revoked_since``, its account suspended or not:
        what a project spent is its keys' requests, whatever became of them."""
        rows = self._rows(
            "SELECT project, name, revoked_at FROM api_keys WHERE project IS NOT NULL "
            "AND (revoked_at IS NULL OR revoked_at >= ?)",
            (revoked_since,),
        )
        return [(r["project"], r["name"], r["revoked_at"]) for r in rows]

    def remove_project(self, name: str) -> bool:
        """Refused while an account or an active key belongs to it."""
        if self.project_members(name):
            raise StoreError(f"project {name!r} has members: move or remove them first")
        if self._rows(
            "SELECT 1 FROM api_keys WHERE project = ? AND revoked_at IS NULL LIMIT 1", (name,)
        ):
            raise StoreError(f"project {name!r} has active keys: revoke them first")
        return bool(self._execute("DELETE FROM projects WHERE name = ?", (name,)).rowcount)

    # -- an account's own keys ------------------------------------------------
    def keys_of(self, owner: str, include_revoked: bool = False) -> list[ApiKeyRecord]:
        sql = "SELECT * FROM api_keys WHERE owner = ?"
        if not include_revoked:
            sql += " AND revoked_at IS NULL"
        return [_key(r) for r in self._rows(sql + " ORDER BY created_at", (owner,))]

    def revoke_own_key(self, owner: str, key_id: str) -> str | None:
        """Revoke ``key_id`` only if ``owner`` owns it (checked in the UPDATE
        itself); its name, or None: no such active key of this owner."""
        rows = self._rows(
            "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND owner = ? "
            "AND revoked_at IS NULL RETURNING name",
            (time.time(), key_id, owner),
        )
        return rows[0]["name"] if rows else None

    # -- sessions -------------------------------------------------------------
    def add_session(self, id_digest: str, account: str, csrf: str, ttl_s: float) -> None:
        now = time.time()
        self._execute("DELETE FROM portal_sessions WHERE expires_at < ?", (now,))
        self._execute(
            "INSERT INTO portal_sessions (id_digest, account, csrf, created_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (id_digest, account, csrf, now, now + ttl_s),
        )

    def get_session(self, id_digest: str) -> SessionRecord | None:
        rows = self._rows(
            "SELECT account, csrf, expires_at FROM portal_sessions "
            "WHERE id_digest = ? AND expires_at > ?",
            (id_digest, time.time()),
        )
        return SessionRecord(**rows[0]) if rows else None

    def end_session(self, id_digest: str) -> None:
        self._execute("DELETE FROM portal_sessions WHERE id_digest = ?", (id_digest,))

    def end_sessions_of(self, account: str) -> None:
        self._execute("DELETE FROM portal_sessions WHERE account = ?", (account,))

    # -- failed sign-ins ------------------------------------------------------
    def note_sign_in_failure(self, account: str, at: float) -> None:
        self._execute("INSERT INTO sign_in_failures (account, at) VALUES (?, ?)", (account, at))

    def sign_in_failures(self, account: str, since: float) -> list[float]:
        """``account``'s failed sign-ins after ``since`` (any name's older
        ones are dropped: names that do not exist leave nothing behind)."""
        self._execute("DELETE FROM sign_in_failures WHERE at <= ?", (since,))
        rows = self._rows(
            "SELECT at FROM sign_in_failures WHERE account = ? ORDER BY at", (account,)
        )
        return [r["at"] for r in rows]

    def clear_sign_in_failures(self, account: str) -> None:
        self._execute("DELETE FROM sign_in_failures WHERE account = ?", (account,))


def _project_columns(policy: dict[str, Any]) -> dict[str, Any]:
    unknown = set(policy) - set(PROJECT_POLICY_FIELDS)
    if unknown:
        raise StoreError(f"not a project policy field: {', '.join(sorted(unknown))}")
    return dict(policy)
