"""The main's webhook dispatcher: one task on the control thread's loop
(never the gateway's request path) that, each round,

- follows the audit chain from a cursor kept in the authority and turns the
  records that are events (a load refused, a node removed, an upgrade or
  rollback finished or failed, a node's audit head flagged) into queued
  deliveries, in the transaction that moves the cursor;
- watches the states nobody audits (a group parked or back, not ready or
  ready again; a certificate near its expiry), kept in the authority too, so
  a restart neither repeats nor loses a change;
- sends the deliveries that are due, and records each attempt: delivered,
  retried later (exponential back-off with jitter), given up, or the
  endpoint disabled (410 Gone, audited).

Everything is on disk: a main restarted with deliveries pending sends them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import Any

import httpx

from letsinfer.config import WebhookSettings
from letsinfer.doctor.cluster import NEAR_EXPIRY_S
from letsinfer.fetch import FetchPolicy, guarded_async_client
from letsinfer.store import AuditRecord, AuthorityStore
from letsinfer.store.webhooks import AUDIT_CURSOR, WATCHED, DeliveryRecord
from letsinfer.webhooks.delivery import Attempt, attempt, retry_delay
from letsinfer.webhooks.events import emit, iso

log = logging.getLogger("letsinfer.webhooks")
ACTOR = "webhooks"  # who the audit says disabled an endpoint
_BATCH = 32  # deliveries sent at once, at most, per round
# A ready group leaving service on purpose (an upgrade, a removal, a scale
# down drains it first) is no news: upgrade.* and the audit say so.
PLANNED = ("draining", "stopping")


def from_audit(r: AuditRecord) -> tuple[str, dict[str, Any]] | None:
    """The event an audit record is, if any, and its data."""
    about: dict[str, Any] = {"audit_seq": r.seq, "detail": r.detail}
    if r.action == "model.load" and r.outcome == "denied":
        return "capacity.exhausted", {"model": r.target, **about}
    if r.action == "node.remove" and r.outcome == "ok":
        return "node.removed", {"node": r.target, **about}
    if r.action in ("model.upgrade", "model.rollback") and r.outcome in ("ok", "failed"):
        kind = r.action.removeprefix("model.")
        done = "finished" if r.outcome == "ok" else "failed"
        return f"{kind}.{done}", {"model": r.target, **about}
    if r.action == "node.audit-head" and r.outcome == "flagged":
        return "audit.tampering", {"node": r.target, **about}
    return None


class Dispatcher:
    def __init__(
        self,
        store: AuthorityStore,
        settings: WebhookSettings,
        policy: FetchPolicy,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.policy = policy
        self.rng = rng or random.Random()
        self._client: httpx.AsyncClient | None = None

    # -- events from the audit chain ------------------------------------------
    def follow_audit(self) -> int:
        """Queue the events appended since the cursor; how many records read."""
        raw = self.store.get_setting(AUDIT_CURSOR)
        if raw is None:  # the first start: history is not sent
            tail = self.store.audit_tail()
            with self.store.transaction():
                self.store.set_setting(AUDIT_CURSOR, str(tail[0] if tail else 0))
            return 0
        records = self.store.audit_after(int(raw), limit=500)
        if not records:
            return 0
        with self.store.transaction():
            for r in records:
                found = from_audit(r)
                if found is not None:
                    event, data = found
                    emit(self.store, f"audit:{r.seq}", event, data, at=r.ts)
            self.store.set_setting(AUDIT_CURSOR, str(records[-1].seq))
        return len(records)

    # -- states nobody audits ------------------------------------------------
    def watch(self, now: float | None = None) -> None:
        """Compare groups' states and certificates' expiries with what the
        last round saw; queue an event per change, in the transaction that
        keeps what this round saw."""
        now = time.time() if now is None else now
        raw = self.store.get_setting(WATCHED)
        first = raw is None  # nothing seen before: what is now is not news
        seen: dict[str, Any] = json.loads(raw) if raw else {}
        groups: dict[str, dict[str, Any]] = seen.get("groups", {})
        warned: list[str] = seen.get("certificates", [])
        events: list[tuple[str, str, dict[str, Any]]] = []
        now_groups: dict[str, dict[str, Any]] = {}
        for g in self.store.watched_groups():
            before = groups.get(g["id"], {"state": None, "down": False})
            state, down = g["state"], bool(before["down"])
            about = {"model": g["service"], "group": g["id"], "node": g["node"]}
            stamp = f"{g['id']}:{now:.3f}"
            if not first and state != before["state"]:
                if state == "parked":
                    events.append(
                        (f"model.parked:{stamp}", "model.parked", {**about, "detail": g["detail"]})
                    )
                elif before["state"] == "parked":
                    events.append((f"model.unparked:{stamp}", "model.unparked", about))
                if (
                    before["state"] == "ready"
                    and g["desired"] == "running"
                    and state not in PLANNED
                ):
                    down = True
                    events.append(
                        (
                            f"group.not_ready:{stamp}",
                            "group.not_ready",
                            {**about, "state": state, "detail": g["detail"]},
                        )
                    )
            if state == "ready" and down:
                down = False
                events.append((f"group.ready:{stamp}", "group.ready", about))
            if g["desired"] != "running":
                down = False  # stopped on purpose: its next ready is no news
            now_groups[g["id"]] = {"state": state, "down": down}
        expiring = self._expiring(now)
        for key, node, not_after in expiring:
            if key not in warned and not first:
                events.append(
                    (
                        key,
                        "certificate.expiring",
                        {
                            "node": node,
                            "not_after": iso(not_after),
                            "days_left": round((not_after - now) / 86400, 1),
                        },
                    )
                )
        kept = {"groups": now_groups, "certificates": [k for k, _, _ in expiring]}
        if not first and kept == seen and not events:
            return  # the common round: nothing written
        with self.store.transaction():
            for event_id, event, data in events:
                emit(self.store, event_id, event, data, at=now)
            self.store.set_setting(WATCHED, json.dumps(kept, sort_keys=True))

    def _expiring(self, now: float) -> list[tuple[str, str, float]]:
        return [
            (
                f"certificate.expiring:{r['name']}:{int(r['cert_not_after'])}",
                r["name"],
                r["cert_not_after"],
            )
            for r in self.store.watched_certificates()
            if r["cert_not_after"] - now < NEAR_EXPIRY_S
        ]

    # -- deliveries ----------------------------------------------------------
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = guarded_async_client(
                self.policy, timeout=self.settings.timeout_s, follow_redirects=False
            )
        return self._client

    async def deliver_due(self, now: float | None = None) -> int:
        """Send what is due (a batch); how many attempts were made."""
        due = self.store.due_deliveries(time.time() if now is None else now, _BATCH)
        if not due:
            return 0
        secrets = {h.url: h.secret for h in self.store.list_webhooks()}
        due = [d for d in due if d.url in secrets]  # (removed meanwhile: its log went too)
        client = self.client()
        results = await asyncio.gather(
            *(attempt(client, d.url, secrets[d.url], d.id, d.body) for d in due)
        )
        for d, result in zip(due, results, strict=True):
            self._record(d, result)
        return len(due)

    def _record(self, d: DeliveryRecord, result: Attempt) -> None:
        tries = d.attempts + 1
        next_at = None
        if not result.delivered and not result.gone and tries < self.settings.max_attempts:
            s = self.settings
            next_at = time.time() + retry_delay(tries, s.retry_base_s, s.retry_max_s, self.rng)
        with self.store.transaction():
            self.store.delivery_attempted(
                d.id, result.status, delivered=result.delivered, next_at=next_at
            )
            if result.gone and self.store.disable_webhook(d.url, "410 Gone"):
                self.store.append_audit(
                    ACTOR,
                    "webhook.disable",
                    "ok",
                    target=d.url,
                    detail="the endpoint answered 410 Gone",
                )
        if result.gone:
            log.warning("webhook %s answered 410 Gone: disabled", d.url)
        elif not result.delivered:
            again = "given up" if next_at is None else f"retry in {next_at - time.time():.0f}s"
            log.info("webhook %s: %s to %s: %s (%s)", d.id, d.event, d.url, result.status, again)

    # -- the loop --------------------------------------------------------------
    def step(self) -> None:
        self.follow_audit()
        self.watch()

    async def run(self) -> None:
        failing = False
        rounds = 0
        try:
            while True:
                await asyncio.sleep(self.settings.interval_s)
                try:
                    self.step()
                    await self.deliver_due()
                    rounds += 1
                    if rounds % 60 == 1:
                        with self.store.transaction():
                            self.store.trim_deliveries(self.settings.keep_deliveries)
                    failing = False
                except Exception:  # said once; a later round catches up
                    if not failing:
                        log.exception("webhooks: the round failed")
                    failing = True
        finally:
            if self._client is not None:
                await self._client.aclose()
