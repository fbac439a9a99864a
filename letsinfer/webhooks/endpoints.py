"""What an operator does to webhook endpoints (`letsinfer webhook ...`):
add one (its URL checked against ``[fetch] allow_networks`` before anything
is recorded), remove one, send it a test event at once. Each change is
audited; the secret never is."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from letsinfer.fetch import FetchPolicy, check_url, guarded_async_client
from letsinfer.store import AuthorityStore, StoreError
from letsinfer.store.webhooks import DeliveryRecord, WebhookRecord
from letsinfer.webhooks.delivery import Attempt, attempt
from letsinfer.webhooks.events import payload


def add_endpoint(
    store: AuthorityStore,
    url: str,
    events: tuple[str, ...],
    secret: str,
    policy: FetchPolicy,
    *,
    actor: str = "cli",
) -> WebhookRecord:
    """Raises FetchRefused (the URL may not be reached) or StoreError (it is
    there already), with nothing recorded."""
    check_url(url, policy)
    with store.transaction():
        hook = store.add_webhook(url, secret, events)
        store.append_audit(actor, "webhook.add", "ok", target=url, detail=",".join(events))
    return hook


def remove_endpoint(store: AuthorityStore, url: str, *, actor: str = "cli") -> None:
    with store.transaction():
        if not store.remove_webhook(url):
            raise StoreError(f"no webhook {url} (see `letsinfer webhook list`)")
        store.append_audit(actor, "webhook.remove", "ok", target=url)


@dataclass(frozen=True)
class SentTest:
    attempt: Attempt
    delivery: DeliveryRecord
    disabled: bool  # it answered 410: disabled now


def send_test(
    store: AuthorityStore, url: str, policy: FetchPolicy, timeout_s: float, *, actor: str = "cli"
) -> SentTest:
    """Send a signed ``webhook.test`` event now, once; logged with the
    endpoint's deliveries. A 410 disables the endpoint, as any delivery's would."""
    hook = store.get_webhook(url)
    if hook is None:
        raise StoreError(f"no webhook {url} (see `letsinfer webhook list`)")
    event_id = f"test:{uuid.uuid4().hex}"
    body = payload("webhook.test", {"webhook": url, "event_id": event_id})
    delivery_id = f"msg_{uuid.uuid4().hex}"

    async def send() -> Attempt:
        async with guarded_async_client(policy, timeout=timeout_s) as client:
            return await attempt(client, url, hook.secret, delivery_id, body)

    result = asyncio.run(send())
    disabled = False
    with store.transaction():
        logged = store.record_test_delivery(
            url, delivery_id, event_id, body, result.status, result.delivered
        )
        if result.gone and store.disable_webhook(url, "410 Gone (webhook test)"):
            disabled = True
            store.append_audit(
                actor, "webhook.disable", "ok", target=url, detail="410 Gone to webhook test"
            )
    return SentTest(result, logged, disabled)
