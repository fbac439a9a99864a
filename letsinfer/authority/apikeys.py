"""API keys: random bearer secrets, stored as SHA-256 digests, shown once.

A fast digest is right here: the keys are 256 random bits, so there is nothing
to brute-force, and the gateway can hash on every request for free.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass

from letsinfer.store import ApiKeyRecord, AuthorityStore, StoreError

KEY_PREFIX = "li-"


@dataclass(frozen=True)
class IssuedKey:
    record: ApiKeyRecord
    secret: str  # the only time the plaintext exists outside the client

    def to_json(self) -> dict[str, object]:
        rec = self.record
        return {
            "name": rec.name,
            "key": self.secret,
            "models": list(rec.models),
            "concurrency": rec.concurrency,
        }


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(
    store: AuthorityStore,
    name: str,
    models: tuple[str, ...] = (),
    concurrency: int | None = None,
    actor: str = "cli",
) -> IssuedKey:
    """Create a key; every allowlisted model must exist (name or alias)."""
    if not name or len(name) > 64 or not name.replace("-", "").replace("_", "").isalnum():
        raise StoreError("key name must be 1-64 letters, digits, '-' or '_'")
    if concurrency is not None and concurrency < 1:
        raise StoreError("concurrency must be at least 1")
    canonical: list[str] = []
    for model in models:
        svc = store.resolve_service(model)
        if svc is None:
            raise StoreError(f"model {model!r} does not exist (see `letsinfer model list`)")
        if svc.name not in canonical:
            canonical.append(svc.name)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    with store.transaction():
        record = store.add_api_key(
            uuid.uuid4().hex,
            name,
            digest(secret),
            secret[: len(KEY_PREFIX) + 6],
            tuple(canonical),
            concurrency,
        )
        store.append_audit(actor, "auth.key.create", "ok", target=name)
    return IssuedKey(record=record, secret=secret)


def revoke_key(
    store: AuthorityStore, name: str, actor: str = "cli", role: str | None = None
) -> None:
    """Revoke an active key, with its audit record, in one transaction."""
    with store.transaction():
        if not store.revoke_api_key(name):
            raise StoreError(f"no active API key named {name!r}")
        store.append_audit(actor, "auth.key.revoke", "ok", role=role, target=name)
