"""API keys: list, create (every option `auth key create` takes), limits, revoke."""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.authority import apikeys
from letsinfer.authority.apikeys import (
    MAX_LIMIT,
    create_key,
    key_listing,
    policy_json,
    revoke_key,
    set_policy,
)
from letsinfer.control.ops.answers import KeyCreated, KeyLimits, KeyListed, KeyRevoked
from letsinfer.control.ops.context import OpsContext
from letsinfer.store import StoreError
from letsinfer.trust.peer import Peer

Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT)]


class KeyPolicyChange(BaseModel):
    """A key's band, limits and cache; a field sent as null clears it, a field
    not sent stays as it is."""

    model_config = ConfigDict(extra="forbid")
    band: Literal["interactive", "standard", "batch"] | None = None
    rpm: Limit | None = None
    tpm: Limit | None = None
    budget_tokens: Limit | None = None
    budget_period: Literal["day", "week", "month"] | None = None
    cache_ttl_s: Limit | None = None
    cache_sampled: bool | None = None

    def change(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class KeyCreate(KeyPolicyChange):
    name: str = Field(min_length=1, max_length=200)
    models: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=256
    )
    concurrency: Limit | None = None


def keys_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["keys"])
    store = ops.store

    @router.get("/v1/ops/keys")
    async def key_list(
        p: Annotated[Peer, ops.need("administrator")], all: bool = False
    ) -> list[KeyListed]:
        """``all``: revoked keys too."""
        return [KeyListed.model_validate(k) for k in key_listing(store, all)]

    @router.get("/v1/ops/keys/{name:path}/limits")
    async def key_limits_shown(
        name: str, p: Annotated[Peer, ops.need("administrator")]
    ) -> KeyLimits:
        try:
            return KeyLimits.model_validate(apikeys.key_limits(store, name))
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc

    @router.post("/v1/ops/keys")
    async def key_create(
        body: KeyCreate, p: Annotated[Peer, ops.need("administrator")]
    ) -> KeyCreated:
        try:
            policy = body.change()
            for field in ("name", "models", "concurrency"):
                policy.pop(field, None)
            issued = create_key(
                store,
                body.name,
                tuple(body.models),
                body.concurrency,
                actor=ops.actor(p),
                policy=policy,
                role=p.identity.role,
            )
        except StoreError as exc:
            raise HTTPException(400, str(exc)) from exc
        await ops.on_change()
        return KeyCreated.model_validate(issued.to_json())

    @router.post("/v1/ops/keys/{name:path}/limits")
    async def key_limits(
        name: str, body: KeyPolicyChange, p: Annotated[Peer, ops.need("administrator")]
    ) -> KeyLimits:
        change = body.change()
        if change.get("band", "") is None or change.get("cache_sampled", False) is None:
            raise HTTPException(400, "band and cache_sampled cannot be cleared, only set")
        try:
            record = set_policy(store, name, change, actor=ops.actor(p), role=p.identity.role)
        except StoreError as exc:
            status = 404 if str(exc).startswith("no active API key") else 400
            raise HTTPException(status, str(exc)) from exc
        await ops.on_change()  # the gateway counts the new limits before this answers
        return KeyLimits.model_validate({"name": record.name, **policy_json(record)})

    @router.post("/v1/ops/keys/{name:path}/revoke")
    async def key_revoke(name: str, p: Annotated[Peer, ops.need("administrator")]) -> KeyRevoked:
        try:
            revoke_key(store, name, actor=ops.actor(p), role=p.identity.role)
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc
        await ops.on_change()  # the gateway's key cache forgets it before this answers
        return KeyRevoked(name=name, revoked=True)

    return router
