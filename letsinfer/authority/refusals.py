"""Refusals in the audit chain: every change the authority refuses leaves one
``denied`` record (who, what, why), as every change it makes leaves an ``ok``
one, whether the CLI wrote the authority itself or asked the running node."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from letsinfer.store import AuthorityStore, StoreError


@contextlib.contextmanager
def audited(
    store: AuthorityStore, actor: str, action: str, target: str | None, *, role: str | None = None
) -> Iterator[None]:
    """A refusal (StoreError) within: one "denied" record, written after any
    transaction within has rolled back, then the error as it was. ``target``:
    the name refused, when it is a valid one (an invalid name is in the
    message, which is the record's detail)."""
    try:
        yield
    except StoreError as exc:
        store.append_audit(
            actor, action, "denied", role=role, target=target, detail=str(exc)[:1000]
        )
        raise
