"""Webhooks from a controller: `webhook add`, `list`, `deliveries`, `test`
and `remove`, with the objects and the changes the CLI on the main makes
(letsinfer.webhooks). An administrator's: a webhook's URL says where the
cluster's events go. A secret comes in the body over mutual TLS (the
workstation read it from its file) and is never said back or logged."""

import asyncio
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from letsinfer.audit.anchor import open_authority
from letsinfer.control.ops.answers import (
    DeliveryShown,
    WebhookAdded,
    WebhookRemoved,
    WebhookShown,
    WebhookTested,
)
from letsinfer.control.ops.context import OpsContext
from letsinfer.fetch import FetchPolicy, FetchRefused
from letsinfer.store import StoreError
from letsinfer.trust.peer import Peer
from letsinfer.webhooks.endpoints import add_endpoint, remove_endpoint, send_test
from letsinfer.webhooks.events import UnknownEvents, parse_events
from letsinfer.webhooks.shown import delivery_rows, webhook_rows
from letsinfer.webhooks.signing import BadSecret, check_secret

MAX_URL = 2048  # as `webhook add` takes


class WebhookNamed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=MAX_URL)


class WebhookAdd(WebhookNamed):
    events: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=64, description="Event names, or ['*'] for every event"
    )
    secret: SecretStr = Field(
        max_length=256, description="'whsec_' + base64 of 24-64 random bytes; never said back"
    )


def webhooks_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["webhooks"])
    store = ops.store

    @router.get("/v1/ops/webhooks")
    async def webhooks(p: Annotated[Peer, ops.need("administrator")]) -> list[WebhookShown]:
        return [WebhookShown.model_validate(r) for r in webhook_rows(store)]

    @router.get("/v1/ops/webhooks/deliveries")
    async def deliveries(
        p: Annotated[Peer, ops.need("administrator")],
        url: Annotated[str, Query(min_length=1, max_length=MAX_URL)],
        limit: Annotated[int, Query(ge=1, le=10_000)] = 50,
    ) -> list[DeliveryShown]:
        """The webhook's newest deliveries, newest first."""
        try:
            rows = delivery_rows(store, url, limit)
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc
        return [DeliveryShown.model_validate(r) for r in rows]

    @router.post("/v1/ops/webhooks")
    async def add(body: WebhookAdd, p: Annotated[Peer, ops.need("administrator")]) -> WebhookAdded:
        """Send these events to the URL, signed with the secret. The URL must
        reach a global address, or one in a network the main's `[fetch]
        allow_networks` lists."""
        try:
            names = parse_events(",".join(body.events))
            secret = check_secret(body.secret.get_secret_value())
        except (UnknownEvents, BadSecret) as exc:
            raise HTTPException(400, f"{exc}. Nothing changed.") from exc
        policy = FetchPolicy.from_settings(ops.settings())
        try:
            add_endpoint(store, body.url, names, secret, policy, actor=ops.actor(p))
        except FetchRefused as exc:
            raise HTTPException(400, f"webhook not added: {exc}") from exc
        except StoreError as exc:
            raise HTTPException(409, str(exc)) from exc
        return WebhookAdded(url=body.url, events=list(names))

    @router.post("/v1/ops/webhooks/test")
    async def test(
        body: WebhookNamed, p: Annotated[Peer, ops.need("administrator")]
    ) -> WebhookTested:
        """Send the URL a signed webhook.test event now and say what it answered."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no authority to log a test in")
        settings, home, actor = ops.settings(), ops.home, ops.actor(p)

        def send() -> WebhookTested:
            # Its own connection, in a worker thread: the send waits on the URL.
            own = open_authority(home)
            try:
                sent = send_test(
                    own,
                    body.url,
                    FetchPolicy.from_settings(settings),
                    settings.webhooks.timeout_s,
                    actor=actor,
                )
            finally:
                own.close()
            return WebhookTested(
                url=body.url,
                status=sent.attempt.status,
                delivered=sent.attempt.delivered,
                disabled=sent.disabled,
                delivery=sent.delivery.id,
            )

        try:
            tested = await asyncio.to_thread(send)
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc
        # (a controller made the main send a request out: on the record)
        store.append_audit(
            actor,
            "webhook.test",
            "ok" if tested.delivered else "failed",
            role=p.identity.role,
            target=body.url,
            detail=f"{tested.status} ({tested.delivery})",
        )
        return tested

    @router.post("/v1/ops/webhooks/remove")
    async def remove(
        body: WebhookNamed, p: Annotated[Peer, ops.need("administrator")]
    ) -> WebhookRemoved:
        """Stop sending to the URL; its pending deliveries and log go with it."""
        try:
            remove_endpoint(store, body.url, actor=ops.actor(p))
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc
        return WebhookRemoved(url=body.url, removed=True)

    return router
