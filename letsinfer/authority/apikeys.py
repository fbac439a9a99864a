"""API keys: random bearer secrets, stored as SHA-256 digests, shown once.

A fast digest is right here: the keys are 256 random bits, so there is nothing
to brute-force, and the gateway can hash on every request for free.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from letsinfer.authority.refusals import audited
from letsinfer.store import ApiKeyRecord, AuthorityStore, StoreError

KEY_PREFIX = "li-"
BANDS = ("interactive", "standard", "batch")  # served in this order when every group is full
PERIODS = ("day", "week", "month")
MAX_LIMIT = 2**63 - 1  # the largest whole number the authority's SQLite can hold


@dataclass(frozen=True)
class IssuedKey:
    record: ApiKeyRecord
    secret: str  # the only time the plaintext exists outside the client
    # Revoked keys that had this name: limits, budgets and usage are kept per
    # name, so a new key under it carries on their spending (a rotation).
    succeeds: int = 0

    def to_json(self) -> dict[str, object]:
        rec = self.record
        return {
            "name": rec.name,
            "key": self.secret,
            "models": list(rec.models),
            "concurrency": rec.concurrency,
            **policy_json(rec),
            "succeeds_revoked": self.succeeds,
        }


def policy_json(rec: ApiKeyRecord) -> dict[str, Any]:
    """A key's band, limits and cache, as `auth key list --json` shows them."""
    return {
        "band": rec.band,
        "rpm": rec.rpm,
        "tpm": rec.tpm,
        "budget_tokens": rec.budget_tokens,
        "budget_period": rec.budget_period,
        "cache_ttl_s": rec.cache_ttl_s,
        "cache_sampled": rec.cache_sampled,
    }


def key_limits(store: AuthorityStore, name: str) -> dict[str, Any]:
    """`auth key limits NAME` with no change: the active key's policy."""
    found = store.list_api_keys(name=name)
    if not found:
        raise StoreError(f"no active API key named {name!r}")
    return {"name": name, **policy_json(found[-1])}


def key_listing(store: AuthorityStore, include_revoked: bool) -> list[dict[str, Any]]:
    """`auth key list --json`: names, prefixes and policies, never secrets."""

    def when(ts: float | None) -> str | None:
        return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else None

    return [
        {
            "name": k.name,
            "prefix": k.prefix,
            "models": list(k.models),  # empty: every model, as `auth key create` takes it
            "concurrency": k.concurrency,
            **policy_json(k),
            "created": when(k.created_at),
            "revoked": when(k.revoked_at),
        }
        for k in store.list_api_keys(include_revoked=include_revoked)
    ]


def check_policy(policy: dict[str, Any], current: ApiKeyRecord | None = None) -> dict[str, Any]:
    """A valid change of band, limits or cache (None clears a limit), or
    StoreError naming what is wrong. ``current``: the key as it is, so a budget
    keeps its period when only its size changes."""
    out = dict(policy)
    band = out.get("band")
    if "band" in out and band not in BANDS:
        raise StoreError(f"band must be one of {', '.join(BANDS)} (got {band!r})")
    for field in ("rpm", "tpm", "budget_tokens", "cache_ttl_s"):
        value = out.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise StoreError(f"{field} must be a whole number")
        if value is not None and value < 1:
            raise StoreError(f"{field} must be at least 1 (or cleared)")
        if value is not None and value > MAX_LIMIT:
            raise StoreError(f"{field} must be at most {MAX_LIMIT} (or cleared)")
    if out.get("budget_period") is not None and out["budget_period"] not in PERIODS:
        raise StoreError(f"budget period must be one of {', '.join(PERIODS)}")
    budget = out.get("budget_tokens", current.budget_tokens if current else None)
    period = out.get("budget_period", current.budget_period if current else None)
    if budget is not None and period is None:
        raise StoreError("a token budget needs its period (day, week or month)")
    if budget is None and out.get("budget_period") is not None:
        raise StoreError("a budget period is for a token budget: give the budget too")
    if budget is None and "budget_tokens" in out:
        out["budget_period"] = None  # no budget, no period
    ttl = out.get("cache_ttl_s", current.cache_ttl_s if current else None)
    if ttl is None and out.get("cache_sampled"):
        raise StoreError("caching sampled answers is for a key with a cache: give its TTL too")
    if ttl is None and "cache_ttl_s" in out:
        out["cache_sampled"] = False  # no cache, nothing cached of any kind
    return out


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(
    store: AuthorityStore,
    name: str,
    models: tuple[str, ...] = (),
    concurrency: int | None = None,
    actor: str = "cli",
    policy: dict[str, Any] | None = None,
    role: str | None = None,
    owner: str | None = None,
    project: str | None = None,
) -> IssuedKey:
    """Create a key; every allowlisted model must exist (name, alias or LoRA
    adapter). ``policy``: its band, limits and cache (see :func:`check_policy`);
    ``owner``, ``project``: the portal account and project it belongs to.
    A refusal is audited and changes nothing else."""
    with audited(store, actor, "auth.key.create", _target(name), role=role):
        return _create_key(store, name, models, concurrency, actor, policy, role, owner, project)


def _target(name: str) -> str | None:
    """A key's name as an audit record's target: None when it is no valid name."""
    plain = name.replace("-", "").replace("_", "")
    return name if name and len(name) <= 64 and plain.isascii() and plain.isalnum() else None


def _create_key(
    store: AuthorityStore,
    name: str,
    models: tuple[str, ...],
    concurrency: int | None,
    actor: str,
    policy: dict[str, Any] | None,
    role: str | None,
    owner: str | None = None,
    project: str | None = None,
) -> IssuedKey:
    if _target(name) is None:
        raise StoreError("key name must be 1-64 ASCII letters, digits, '-' or '_'")
    if concurrency is not None and not 1 <= concurrency <= MAX_LIMIT:
        raise StoreError(f"concurrency must be between 1 and {MAX_LIMIT}")
    policy = check_policy({k: v for k, v in (policy or {}).items() if v is not None})
    canonical: list[str] = []
    for model in models:
        svc = store.resolve_service(model)
        adapter = store.get_adapter(model) if svc is None else None
        if svc is None and adapter is None:
            raise StoreError(f"model {model!r} does not exist (see `letsinfer model list`)")
        allowed = svc.name if svc is not None else model
        if allowed not in canonical:
            canonical.append(allowed)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    with store.transaction():
        earlier = len(store.list_api_keys(include_revoked=True, name=name))
        record = store.add_api_key(
            uuid.uuid4().hex,
            name,
            digest(secret),
            secret[: len(KEY_PREFIX) + 6],
            tuple(canonical),
            concurrency,
            policy,
            owner,
            project,
        )
        store.append_audit(
            actor,
            "auth.key.create",
            "ok",
            role=role,
            target=name,
            detail=policy_text(policy) or None,
        )
    return IssuedKey(record=record, secret=secret, succeeds=earlier)


def policy_text(policy: dict[str, Any]) -> str:
    """A change for the audit chain: 'band=batch rpm=60 tpm=off'."""
    return " ".join(f"{k}={'off' if v is None else v}" for k, v in sorted(policy.items()))


def set_policy(
    store: AuthorityStore,
    name: str,
    policy: dict[str, Any],
    actor: str = "cli",
    role: str | None = None,
) -> ApiKeyRecord:
    """`auth key limits`: change an active key's band, limits or cache, with its
    audit record, in one transaction. The gateway applies it at its next
    directory refresh (at once when asked through the running node). A refusal
    is audited and changes nothing else."""
    with audited(store, actor, "auth.key.limits", _target(name), role=role):
        current = store.list_api_keys(name=name)
        if not current:
            raise StoreError(f"no active API key named {name!r}")
        change = check_policy(policy, current[-1])
    with store.transaction():
        store.set_key_policy(name, change)
        store.append_audit(
            actor, "auth.key.limits", "ok", role=role, target=name, detail=policy_text(change)
        )
    return store.list_api_keys(name=name)[-1]


@dataclass(frozen=True)
class KeysNaming:
    """Active keys whose model lists name models (or adapters) about to go."""

    narrowed: dict[str, tuple[str, ...]]  # key name -> its list without them
    stranded: list[str]  # keys that may use nothing else

    def refusal(self, going: str) -> str:
        keys = ", ".join(self.stranded)
        revoke = "; ".join(f"`letsinfer auth key revoke {k}`" for k in self.stranded)
        return (
            f"the API key(s) {keys} may use only {going}: without it their model list "
            f"would be empty, and an empty list allows every model. Revoke them first ({revoke})"
        )

    def apply(self, store: AuthorityStore) -> None:
        """Inside the caller's transaction."""
        for name, models in self.narrowed.items():
            store.set_key_models(name, models)


def keys_naming(store: AuthorityStore, going: set[str]) -> KeysNaming:
    """What removing the models or adapters ``going`` does to API keys: a key
    that lists them loses them; one that lists nothing else must go first (a
    later model of the same name must not inherit its permission)."""
    narrowed, stranded = {}, []
    for key in store.list_api_keys():
        if not going.intersection(key.models):
            continue
        left = tuple(m for m in key.models if m not in going)
        if left:
            narrowed[key.name] = left
        else:
            stranded.append(key.name)
    return KeysNaming(narrowed, stranded)


def revoke_key(
    store: AuthorityStore, name: str, actor: str = "cli", role: str | None = None
) -> None:
    """Revoke an active key, with its audit record, in one transaction (a
    refusal is audited once it has rolled back)."""
    with audited(store, actor, "auth.key.revoke", _target(name), role=role), store.transaction():
        if not store.revoke_api_key(name):
            raise StoreError(f"no active API key named {name!r}")
        store.append_audit(actor, "auth.key.revoke", "ok", role=role, target=name)
