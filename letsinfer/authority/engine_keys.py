"""Per-replica engine keys: HMAC over a secret that only the authority holds.

The gateway derives the key for the replica it calls; nothing stores it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from letsinfer.store import AuthorityStore

_SETTING = "engine_key_secret"


def ensure_secret(store: AuthorityStore) -> bytes:
    with store.transaction():
        value = store.get_setting(_SETTING)
        if value is None:
            value = secrets.token_hex(32)
            store.set_setting(_SETTING, value)
    return bytes.fromhex(value)


def derive(secret: bytes, pg_id: str, task: str) -> str:
    """Stable for a task across engine restarts; different for every task."""
    msg = f"{pg_id}|{task}".encode()
    return "lie-" + hmac.new(secret, msg, hashlib.sha256).hexdigest()
