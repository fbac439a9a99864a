"""Webhooks' SQL (letsinfer.webhooks): the endpoints operators add, and the
delivery queue on disk — one row per (endpoint, event), so an event emitted
twice is delivered once, and its id (the ``webhook-id`` header) stays the
same across retries.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from letsinfer.store.plumbing import Plumbing
from letsinfer.store.records import StoreError

PENDING, DELIVERED, FAILED, DROPPED = "pending", "delivered", "failed", "dropped"
# The settings key of the last audit record the dispatcher turned into events.
AUDIT_CURSOR = "webhooks.audit_seq"
# The settings key of what the dispatcher's state watch saw last (JSON).
WATCHED = "webhooks.watched"


@dataclass(frozen=True)
class WebhookRecord:
    url: str
    secret: str
    events: tuple[str, ...]  # ("*",): every event
    state: str  # active | disabled
    disabled_reason: str | None
    created_at: float

    def wants(self, event: str) -> bool:
        return "*" in self.events or event in self.events


@dataclass(frozen=True)
class DeliveryRecord:
    id: str  # the webhook-id, the same at every attempt
    url: str
    event_id: str
    event: str
    body: str
    created_at: float
    attempts: int
    last_status: str | None
    state: str  # pending | delivered | failed (gave up) | dropped (endpoint disabled)
    next_at: float | None
    delivered_at: float | None


def _webhook(row: dict[str, Any]) -> WebhookRecord:
    return WebhookRecord(
        row["url"],
        row["secret"],
        tuple(json.loads(row["events"])),
        row["state"],
        row["disabled_reason"],
        row["created_at"],
    )


class WebhookTables(Plumbing):
    if TYPE_CHECKING:

        def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...

    # -- endpoints -----------------------------------------------------------
    def add_webhook(self, url: str, secret: str, events: tuple[str, ...]) -> WebhookRecord:
        """The caller's transaction; an endpoint already there is refused."""
        if self.get_webhook(url) is not None:
            raise StoreError(f"a webhook for {url} exists already (remove it first)")
        self._execute(
            "INSERT INTO webhooks (url, secret, events, state, created_at) "
            "VALUES (?, ?, ?, 'active', ?)",
            (url, secret, json.dumps(list(events)), time.time()),
        )
        rec = self.get_webhook(url)
        assert rec is not None
        return rec

    def get_webhook(self, url: str) -> WebhookRecord | None:
        rows = self._rows("SELECT * FROM webhooks WHERE url = ?", (url,))
        return _webhook(rows[0]) if rows else None

    def list_webhooks(self) -> list[WebhookRecord]:
        return [_webhook(r) for r in self._rows("SELECT * FROM webhooks ORDER BY created_at")]

    def remove_webhook(self, url: str) -> bool:
        """The endpoint and its delivery log; the caller's transaction."""
        self._execute("DELETE FROM webhook_deliveries WHERE url = ?", (url,))
        return bool(self._execute("DELETE FROM webhooks WHERE url = ?", (url,)).rowcount)

    def disable_webhook(self, url: str, reason: str) -> bool:
        """No more deliveries to it: what was pending is dropped. False: it
        was disabled (or gone) already. The caller's transaction."""
        changed = self._execute(
            "UPDATE webhooks SET state = 'disabled', disabled_reason = ? "
            "WHERE url = ? AND state = 'active'",
            (reason, url),
        ).rowcount
        if changed:
            self._execute(
                "UPDATE webhook_deliveries SET state = ?, next_at = NULL "
                "WHERE url = ? AND state = ?",
                (DROPPED, url, PENDING),
            )
        return bool(changed)

    # -- the delivery queue --------------------------------------------------
    def queue_webhook_event(
        self, event_id: str, event: str, body: str, at: float | None = None
    ) -> int:
        """One delivery per active endpoint that wants ``event``, due now;
        an (endpoint, event id) queued before is left as it is. How many
        were queued."""
        now = time.time() if at is None else at
        queued = 0
        for hook in self.list_webhooks():
            if hook.state != "active" or not hook.wants(event):
                continue
            queued += self._execute(
                "INSERT OR IGNORE INTO webhook_deliveries "
                "(id, url, event_id, event, body, created_at, attempts, state, next_at) "
                "VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
                (f"msg_{uuid.uuid4().hex}", hook.url, event_id, event, body, now, PENDING, now),
            ).rowcount
        return queued

    def record_test_delivery(
        self, url: str, delivery_id: str, event_id: str, body: str, status: str, delivered: bool
    ) -> DeliveryRecord:
        """A ``webhook test`` delivery, tried once at once: logged, never retried."""
        now = time.time()
        self._execute(
            "INSERT INTO webhook_deliveries (id, url, event_id, event, body, created_at, "
            "attempts, last_status, state, next_at, delivered_at) "
            "VALUES (?, ?, ?, 'webhook.test', ?, ?, 1, ?, ?, NULL, ?)",
            (
                delivery_id,
                url,
                event_id,
                body,
                now,
                status,
                DELIVERED if delivered else FAILED,
                now if delivered else None,
            ),
        )
        rec = self.get_delivery(delivery_id)
        assert rec is not None
        return rec

    def get_delivery(self, delivery_id: str) -> DeliveryRecord | None:
        rows = self._rows("SELECT * FROM webhook_deliveries WHERE id = ?", (delivery_id,))
        return DeliveryRecord(**rows[0]) if rows else None

    def due_deliveries(self, now: float, limit: int) -> list[DeliveryRecord]:
        rows = self._rows(
            "SELECT d.* FROM webhook_deliveries d JOIN webhooks w ON w.url = d.url "
            "WHERE d.state = ? AND d.next_at <= ? AND w.state = 'active' "
            "ORDER BY d.next_at LIMIT ?",
            (PENDING, now, limit),
        )
        return [DeliveryRecord(**r) for r in rows]

    def next_delivery_at(self) -> float | None:
        rows = self._rows(
            "SELECT MIN(next_at) AS at FROM webhook_deliveries WHERE state = ?", (PENDING,)
        )
        return rows[0]["at"] if rows else None

    def delivery_attempted(
        self, delivery_id: str, status: str, *, delivered: bool, next_at: float | None
    ) -> None:
        """One attempt's outcome: delivered, due again at ``next_at``, or
        (neither) given up."""
        state = DELIVERED if delivered else (PENDING if next_at is not None else FAILED)
        self._execute(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, last_status = ?, "
            "state = ?, next_at = ?, delivered_at = ? WHERE id = ? AND state = ?",
            (
                status,
                state,
                None if delivered else next_at,
                time.time() if delivered else None,
                delivery_id,
                PENDING,
            ),
        )

    def list_deliveries(self, url: str, limit: int = 100) -> list[DeliveryRecord]:
        """The endpoint's latest deliveries, newest first."""
        rows = self._rows(
            "SELECT * FROM webhook_deliveries WHERE url = ? "
            "ORDER BY created_at DESC, rowid DESC LIMIT ?",
            (url, limit),
        )
        return [DeliveryRecord(**r) for r in rows]

    def trim_deliveries(self, keep: int) -> int:
        """Keep the log bounded: at most ``keep`` finished deliveries per
        endpoint (the newest); pending ones always stay. Rows removed."""
        return int(
            self._execute(
                "DELETE FROM webhook_deliveries WHERE state != ? AND rowid IN ("
                " SELECT rowid FROM (SELECT rowid, ROW_NUMBER() OVER ("
                "  PARTITION BY url ORDER BY created_at DESC, rowid DESC) AS n"
                "  FROM webhook_deliveries WHERE state != ?) WHERE n > ?)",
                (PENDING, PENDING, keep),
            ).rowcount
        )

    # -- what the dispatcher watches -------------------------------------------
    def watched_groups(self) -> list[dict[str, Any]]:
        """Every placement group's id, model, node, desired and observed state."""
        return self._rows(
            "SELECT g.id, g.service, g.desired, g.state, g.detail, n.name AS node "
            "FROM placement_groups g LEFT JOIN nodes n ON n.id = g.node_id"
        )

    def watched_certificates(self) -> list[dict[str, Any]]:
        """Each node's name and the expiry of its certificate (a child's: the
        one it presented; the main's: the one on its disk)."""
        return self._rows(
            "SELECT id, name, cert_not_after FROM nodes "
            "WHERE state != 'removed' AND cert_not_after IS NOT NULL"
        )
