"""Webhooks as `webhook list` and `webhook deliveries` show them, the same
objects on the main and (through the admin API) on a paired controller."""

from __future__ import annotations

from datetime import UTC, datetime

from letsinfer.store import AuthorityStore, StoreError
from letsinfer.store.webhooks import DeliveryRecord


def _when(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else None


def webhook_rows(store: AuthorityStore) -> list[dict[str, object]]:
    return [
        {
            "url": h.url,
            "events": ",".join(h.events),
            "state": h.state,
            "disabled_reason": h.disabled_reason,
            "created": _when(h.created_at),
        }
        for h in store.list_webhooks()
    ]


def delivery_row(d: DeliveryRecord) -> dict[str, object]:
    return {
        "id": d.id,
        "event": d.event,
        "state": d.state,
        "attempts": d.attempts,
        "last_status": d.last_status,
        "next_try": _when(d.next_at) if d.state == "pending" else None,
        "delivered_at": _when(d.delivered_at),
        "created": _when(d.created_at),
    }


def delivery_rows(store: AuthorityStore, url: str, limit: int) -> list[dict[str, object]]:
    """URL's newest ``limit`` deliveries, newest first; StoreError: no such webhook."""
    if store.get_webhook(url) is None:
        raise StoreError(f"no webhook {url} (see `letsinfer webhook list`)")
    return [delivery_row(d) for d in store.list_deliveries(url, limit)]
