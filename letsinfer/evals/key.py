"""The main's own API key for eval runs: ``letsinfer eval`` sends its cases to
the gateway as real requests, so it needs a key, and only it may pin a
request to one placement group (``X-Letsinfer-Group``).

Its name, ``letsinfer:eval``, is one ``auth key create`` refuses (a colon),
so no client key can be given it; the gateway trusts the group header from
this name alone. Its secret is held in a file under the main's home (mode
0600, like the node's other secrets) and the key in the authority, hashed,
like every key; a key revoked or a file lost is replaced at the next run, the
replacement audited.
"""

from __future__ import annotations

import os
import secrets
import uuid
from pathlib import Path

from letsinfer.authority.apikeys import KEY_PREFIX, digest
from letsinfer.gateway.pinning import EVAL_KEY_NAME
from letsinfer.home import Home
from letsinfer.store import AuthorityStore

KEY_NAME = EVAL_KEY_NAME  # (the gateway trusts the group header from it alone)


def secret_file(home: Home) -> Path:
    return home.etc / "eval.key"


def eval_key(store: AuthorityStore, home: Home, actor: str = "cli") -> tuple[str, bool]:
    """The eval key's secret, and whether it was made now (the gateway knows
    it at its next directory refresh: the runner waits for that)."""
    path = secret_file(home)
    try:
        held = path.read_text().strip()
    except FileNotFoundError:
        held = ""
    live = store.list_api_keys(name=KEY_NAME)
    if held and any(k.digest == digest(held) for k in live):
        return held, False
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    with store.transaction():
        for _ in live:  # (one at most: a live name is unique)
            store.revoke_api_key(KEY_NAME)
        store.add_api_key(
            uuid.uuid4().hex, KEY_NAME, digest(secret), secret[: len(KEY_PREFIX) + 6], (), None
        )
        store.append_audit(actor, "eval.key.create", "ok", target=KEY_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(path.name + ".new")
    fd = os.open(fresh, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret + "\n")
    fresh.replace(path)
    return secret, True
