"""Signing in: the password first (a dummy hash for a name that does not
exist, so the answer and its time are the same), the account's state after
it, and guessing bounded per account: ``signin_failures`` failures within
``signin_window_s`` and the account's sign-in answers 429 (with
Retry-After) until the oldest of them leaves the window, whoever asks and
from wherever. Runs on the portal's own thread (argon2 takes a while)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from letsinfer.config import PortalSettings
from letsinfer.portal.passwords import verify
from letsinfer.store import AuthorityStore
from letsinfer.store.people import ACTIVE, AccountRecord

WRONG = "wrong"  # wrong password or no such account: one answer for both
THROTTLED = "throttled"
NOT_ACTIVE = "not_active"
OK = "ok"


@dataclass(frozen=True)
class Attempt:
    outcome: str
    account: AccountRecord | None = None
    retry_after: int = 0


def sign_in(store: AuthorityStore, settings: PortalSettings, name: str, password: str) -> Attempt:
    now = time.time()
    name = name[:64]
    with store.transaction():
        failures = store.sign_in_failures(name, now - settings.signin_window_s)
    if len(failures) >= settings.signin_failures:
        oldest = failures[-settings.signin_failures]
        wait = math.ceil(oldest + settings.signin_window_s - now)
        return Attempt(THROTTLED, retry_after=max(1, wait))
    account = store.get_account(name)
    if not verify(account.password_hash if account is not None else None, password):
        with store.transaction():
            store.note_sign_in_failure(name, now)
        return Attempt(WRONG)
    assert account is not None
    with store.transaction():
        store.clear_sign_in_failures(name)
    if account.state != ACTIVE or account.project is None:
        return Attempt(NOT_ACTIVE, account)
    return Attempt(OK, account)
