"""The events a webhook may subscribe to, and how one is queued.

An event has an id of its own, chosen from what it is about (the audit
record it comes from, the group and the state it reached, the certificate
that expires): emitting it twice queues it once per endpoint.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any, Protocol

# name -> what it means (docs/webhooks.md lists the same).
EVENTS: dict[str, str] = {
    "model.parked": "a model's placement group kept failing to start and was parked",
    "model.unparked": "a parked placement group was started afresh",
    "group.not_ready": "a placement group meant to run stopped being ready",
    "group.ready": "a placement group that was not ready is ready again",
    "node.stale": "a child node sent no facts for longer than its staleness window",
    "node.removed": "a node was removed from the cluster",
    "certificate.expiring": "a node's certificate expires within the warning window",
    "key.budget_exhausted": "an API key spent its token budget for the period",
    "project.budget_exhausted": "a project's keys together spent its token budget for the period",
    "upgrade.finished": "a model's runtime upgrade finished",
    "upgrade.failed": "a model's runtime upgrade failed (the prior release restored)",
    "rollback.finished": "a model's rollback finished",
    "rollback.failed": "a model's rollback failed",
    "audit.tampering": "a node's signed audit head shows its chain was cut or rewritten",
    "capacity.exhausted": "a load was refused: the model fits nowhere, even after eviction",
    "webhook.test": "sent by `letsinfer webhook test URL`",
}
ALL = "*"


class UnknownEvents(ValueError):
    pass


def parse_events(text: str) -> tuple[str, ...]:
    """``--events`` as given (comma-separated names, or ``*``): the names in
    order, once each; an unknown name is refused with the known list."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UnknownEvents(f"no event named; known events: {', '.join(EVENTS)} (or * for all)")
    if ALL in names:
        return (ALL,)
    unknown = [n for n in names if n not in EVENTS]
    if unknown:
        raise UnknownEvents(
            f"unknown event{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"known events: {', '.join(EVENTS)} (or * for all)"
        )
    return tuple(dict.fromkeys(names))


def iso(ts: float | None) -> str | None:
    """A time in the payloads: ISO 8601, UTC."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def payload(event: str, data: dict[str, Any], at: float | None = None) -> str:
    """The body every endpoint gets (Standard Webhooks' shape): type,
    timestamp, data."""
    when = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    body = {
        "type": event,
        "timestamp": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "data": data,
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


class Queue(Protocol):
    def transaction(self) -> Any: ...
    def queue_webhook_event(
        self, event_id: str, event: str, body: str, at: float | None = None
    ) -> int: ...


def emit(
    store: Queue, event_id: str, event: str, data: dict[str, Any], at: float | None = None
) -> int:
    """Queue ``event`` for every endpoint that wants it (in the caller's
    transaction, or one of its own); how many deliveries were queued."""
    assert event in EVENTS, event
    with store.transaction():
        return store.queue_webhook_event(event_id, event, payload(event, data, at), at)
