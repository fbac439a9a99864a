"""The typed operations on a main node, each within a role: the same routes
for a paired controller (mutual TLS, role from its certificate) and for a local
administrator (the admin unix socket, peer credentials). Nothing runs commands.

Roles: viewer reads state; operator adds lifecycle (pause, resume, model
start/stop); administrator adds keys and fallbacks (and, through the CLI on
the main, controllers, nodes and settings).
"""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from letsinfer import __version__
from letsinfer.authority import controllers, lifecycle
from letsinfer.authority.apikeys import create_key, policy_json, revoke_key, set_policy
from letsinfer.authority.external import fallback_notes, set_fallback
from letsinfer.authority.links import ResumeRefused, resume_model
from letsinfer.capacity.setting import set_policy as set_scaling_policy
from letsinfer.identity import NodeIdentity
from letsinfer.storage import refetch
from letsinfer.store import AuthorityStore, StoreError
from letsinfer.trust.peer import Peer, gated_peer


class KeyPolicyChange(BaseModel):
    """A key's band, limits and cache; a field sent as null clears it, a field
    not sent stays as it is."""

    model_config = ConfigDict(extra="forbid")
    band: Literal["interactive", "standard", "batch"] | None = None
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    budget_tokens: int | None = Field(None, ge=1)
    budget_period: Literal["day", "week", "month"] | None = None
    cache_ttl_s: int | None = Field(None, ge=1)
    cache_sampled: bool | None = None

    def change(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class KeyCreate(KeyPolicyChange):
    name: str
    models: list[str] = Field(default_factory=list)
    concurrency: int | None = Field(None, ge=1)


class ScaleChange(BaseModel):
    """A model's scaling policy; a field not sent stays as it is."""

    model_config = ConfigDict(extra="forbid")
    min_groups: int | None = Field(None, ge=0, le=64)
    max_groups: int | None = Field(None, ge=1, le=64)
    idle_s: float | None = Field(None, ge=0, le=30 * 86400)
    min_resident_s: float | None = Field(None, ge=0, le=30 * 86400)
    target_inflight: float | None = Field(None, gt=0, le=10_000)
    scale_down_s: float | None = Field(None, ge=0, le=30 * 86400)

    def change(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump(exclude_unset=True).items() if v is not None}


class FallbackChange(BaseModel):
    """The model that answers when another cannot; null: none."""

    model_config = ConfigDict(extra="forbid")
    fallback: str | None


def actor_of(store: AuthorityStore, p: Peer) -> str:
    """How the audit chain names a peer."""
    if p.identity.kind == "controller":
        rec = store.get_controller(p.identity.id)
        return f"controller:{rec.name if rec else p.identity.id}"
    return f"{p.identity.kind}:{p.identity.id}"


async def nothing_to_apply() -> None:
    return None


def ops_router(
    store: AuthorityStore,
    identity: NodeIdentity,
    on_change: Callable[[], Awaitable[None]] = nothing_to_apply,
) -> APIRouter:
    """``on_change`` runs after each mutation: the node applies it at once
    instead of at its next reconcile."""
    router = APIRouter()

    def actor(p: Peer) -> str:
        return actor_of(store, p)

    def need(role: str) -> Callable[[Request], Awaitable[Peer]]:
        async def check(request: Request) -> Peer:
            p = gated_peer(request)
            if not controllers.allows(p.identity.role, role):
                store.append_audit(
                    actor(p),
                    request.url.path,
                    "denied",
                    role=p.identity.role,
                    detail=f"needs {role}",
                )
                raise HTTPException(
                    403,
                    f"this operation needs the {role} role; this controller is {p.identity.role}",
                )
            return p

        return check

    @router.get("/v1/ops/state")
    async def state(p: Annotated[Peer, Depends(need("viewer"))]) -> dict[str, Any]:
        return {
            "nodes": [
                {
                    "id": n.id,
                    "name": n.name,
                    "role": n.role,
                    "state": n.state,
                    "paused": n.paused,
                    "last_seen": n.last_seen,
                }
                for n in store.list_nodes()
            ],
            "models": [{"name": s.name, "aliases": list(s.aliases)} for s in store.list_services()],
            "placement_groups": [
                {
                    "id": g.id,
                    "model": g.service,
                    "node": g.node_id,
                    "desired": g.desired,
                    "state": g.state,
                }
                for g in store.list_placement_groups()
            ],
        }

    async def set_desired(name: str, desired: str, p: Peer) -> dict[str, Any]:
        try:
            done = lifecycle.set_model_desired(
                store, name, desired, actor=actor(p), role=p.identity.role
            )
        except lifecycle.NotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        except lifecycle.Refused as exc:
            raise HTTPException(409, f"{exc}. Nothing changed.") from exc
        await on_change()
        return done.to_json()

    @router.post("/v1/ops/models/{name:path}/stop")
    async def model_stop(
        name: str, p: Annotated[Peer, Depends(need("operator"))]
    ) -> dict[str, Any]:
        return await set_desired(name, "stopped", p)

    @router.post("/v1/ops/models/{name:path}/start")
    async def model_start(
        name: str, p: Annotated[Peer, Depends(need("operator"))]
    ) -> dict[str, Any]:
        answer = await set_desired(name, "running", p)
        return {**answer, "downloads": refetch.downloads(store, answer["model"])}

    @router.post("/v1/ops/models/{name:path}/fallback")
    async def model_fallback(
        name: str, body: FallbackChange, p: Annotated[Peer, Depends(need("administrator"))]
    ) -> dict[str, Any]:
        # An administrator's: a fallback may send requests to a provider outside.
        try:
            svc = set_fallback(store, name, body.fallback, actor=actor(p), role=p.identity.role)
        except StoreError as exc:
            status = 404 if str(exc).startswith("no model") else 400
            raise HTTPException(status, f"{exc}. Nothing changed.") from exc
        await on_change()  # the gateway uses it before this answers
        return {"model": svc.name, "fallback": svc.fallback, "notes": fallback_notes(store, name)}

    @router.post("/v1/ops/models/{name:path}/scale")
    async def model_scale(
        name: str, body: ScaleChange, p: Annotated[Peer, Depends(need("operator"))]
    ) -> dict[str, Any]:
        try:
            canonical, policy = set_scaling_policy(
                store, name, body.change(), actor=actor(p), role=p.identity.role
            )
        except StoreError as exc:
            status = 404 if str(exc).startswith("no model") else 400
            raise HTTPException(status, f"{exc}. Nothing changed.") from exc
        await on_change()  # the gateway loads and unloads by it before this answers
        return {"model": canonical, "policy": policy.to_json(), "summary": policy.describe()}

    @router.post("/v1/ops/keys")
    async def key_create(
        body: KeyCreate, p: Annotated[Peer, Depends(need("administrator"))]
    ) -> dict[str, Any]:
        try:
            policy = body.change()
            for field in ("name", "models", "concurrency"):
                policy.pop(field, None)
            issued = create_key(
                store,
                body.name,
                tuple(body.models),
                body.concurrency,
                actor=actor(p),
                policy=policy,
                role=p.identity.role,
            )
        except StoreError as exc:
            raise HTTPException(400, str(exc)) from exc
        await on_change()
        return issued.to_json()

    @router.post("/v1/ops/keys/{name:path}/limits")
    async def key_limits(
        name: str, body: KeyPolicyChange, p: Annotated[Peer, Depends(need("administrator"))]
    ) -> dict[str, Any]:
        change = body.change()
        if change.get("band", "") is None or change.get("cache_sampled", False) is None:
            raise HTTPException(400, "band and cache_sampled cannot be cleared, only set")
        try:
            record = set_policy(store, name, change, actor=actor(p), role=p.identity.role)
        except StoreError as exc:
            status = 404 if str(exc).startswith("no active API key") else 400
            raise HTTPException(status, str(exc)) from exc
        await on_change()  # the gateway counts the new limits before this answers
        return {"name": record.name, **policy_json(record)}

    @router.post("/v1/ops/keys/{name:path}/revoke")
    async def key_revoke(
        name: str, p: Annotated[Peer, Depends(need("administrator"))]
    ) -> dict[str, Any]:
        try:
            revoke_key(store, name, actor=actor(p), role=p.identity.role)
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc
        await on_change()  # the gateway's key cache forgets it before this answers
        return {"name": name, "revoked": True}

    async def pause_node(name: str, paused: bool, p: Peer) -> dict[str, Any]:
        try:
            node = lifecycle.find_node(store, name)
        except lifecycle.NotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        lifecycle.set_node_paused(store, node, paused, actor=actor(p), role=p.identity.role)
        await on_change()
        return {"node": node.name, "paused": paused}

    @router.post("/v1/ops/nodes/{name:path}/pause")
    async def node_pause(
        name: str, p: Annotated[Peer, Depends(need("operator"))]
    ) -> dict[str, Any]:
        return await pause_node(name, True, p)

    @router.post("/v1/ops/nodes/{name:path}/resume")
    async def node_resume(
        name: str, p: Annotated[Peer, Depends(need("operator"))]
    ) -> dict[str, Any]:
        return await pause_node(name, False, p)

    @router.post("/v1/ops/models/{name:path}/resume")
    async def model_resume(
        name: str, p: Annotated[Peer, Depends(need("operator"))]
    ) -> dict[str, Any]:
        try:
            done = resume_model(store, name, actor=actor(p), role=p.identity.role)
        except ResumeRefused as exc:
            status = 404 if str(exc).startswith("no model") else 409
            raise HTTPException(status, f"{exc}. Nothing changed.") from exc
        await on_change()
        return done.to_json()

    @router.get("/v1/ops/version")
    async def version(p: Annotated[Peer, Depends(need("viewer"))]) -> dict[str, str]:
        return {"version": __version__, "main": identity.name}

    return router
