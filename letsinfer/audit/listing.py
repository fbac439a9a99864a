"""`letsinfer audit list` as data: each record of the chain with its time in
words. The CLI on a node and the admin API (a controller's `audit list`) both
answer with this."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from letsinfer.store import AuthorityStore


def audit_rows(store: AuthorityStore, limit: int | None = None) -> list[dict[str, Any]]:
    """Oldest first; ``limit``: only the newest N records."""
    return [
        {**asdict(r), "time": datetime.fromtimestamp(r.ts, UTC).isoformat(timespec="seconds")}
        for r in store.list_audit(limit)
    ]
