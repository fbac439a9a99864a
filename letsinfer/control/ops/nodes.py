"""Nodes: what one says of itself; pause (no new work) and resume; remove;
and a join code for a new one (`node add --code`)."""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.authority import lifecycle
from letsinfer.authority.joining import MAX_TTL_S, join_code_issued
from letsinfer.authority.removal import Removal, RemovalRefused, remove_node
from letsinfer.control.agent_info import InfoRefused, agent_info
from letsinfer.control.ops.answers import JoinCodeIssued, NodeInfo, NodePaused, NodeRemoved
from letsinfer.control.ops.context import OpsContext
from letsinfer.store import AuthorityStore
from letsinfer.trust.peer import Peer


class JoinCodeAsk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_s: float = Field(900.0, gt=0, le=MAX_TTL_S, description="How long the code works")


# After a removal committed: stop routing, tell the node; returns what the node said.
OnRemoved = Callable[[Removal], Awaitable[dict[str, Any]]]


async def removed_node(
    store: AuthorityStore, name: str, actor: str, role: str | None, on_removed: OnRemoved
) -> dict[str, Any]:
    """`node remove` as the admin socket and the admin API both do it: the
    removal (a refusal audited, and nothing changed), then the running node
    applies it. HTTPException 404 or 409 when refused."""
    try:
        removal = remove_node(store, name, actor=actor, role=role)
    except RemovalRefused as exc:
        store.append_audit(actor, "node.remove", "denied", role=role, target=name, detail=str(exc))
        status = 404 if str(exc).startswith("no node") else 409
        raise HTTPException(status, f"{exc}. Nothing changed.") from exc
    return {**removal.to_json(), **(await on_removed(removal))}


def nodes_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["nodes"])
    store = ops.store

    async def pause_node(name: str, paused: bool, p: Peer) -> NodePaused:
        try:
            node = lifecycle.find_node(store, name)
        except lifecycle.NotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        lifecycle.set_node_paused(store, node, paused, actor=ops.actor(p), role=p.identity.role)
        await ops.on_change()
        return NodePaused(node=node.name, paused=paused)

    @router.post("/v1/ops/nodes/{name:path}/pause")
    async def node_pause(name: str, p: Annotated[Peer, ops.need("operator")]) -> NodePaused:
        return await pause_node(name, True, p)

    @router.post("/v1/ops/nodes/{name:path}/resume")
    async def node_resume(name: str, p: Annotated[Peer, ops.need("operator")]) -> NodePaused:
        return await pause_node(name, False, p)

    @router.get("/v1/ops/nodes/{name:path}/info")
    async def node_info(name: str, p: Annotated[Peer, ops.need("viewer")]) -> NodeInfo:
        """What the node's agent says of itself, asked by the main over mutual TLS."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no node certificate to ask with")
        try:
            node, said = await agent_info(ops.home, ops.identity, store, name)
        except InfoRefused as exc:
            raise HTTPException(exc.status, str(exc)) from exc
        return NodeInfo(node=node, info=said)

    @router.post("/v1/ops/join-codes")
    async def join_code(
        body: JoinCodeAsk, p: Annotated[Peer, ops.need("administrator")]
    ) -> JoinCodeIssued:
        """`node add --code`: a one-time join code; `letsinfer join` on the
        new machine enrolls it (the code's secret is kept nowhere on the main)."""
        from letsinfer.agent.runtime import advertise_address

        assert ops.identity.cluster is not None  # (the CA's fingerprint)
        control = ops.settings().control
        address = f"{advertise_address(control.host, control.advertise)}:{control.port}"
        issued = join_code_issued(
            store,
            ops.identity.cluster,
            body.ttl_s,
            address,
            actor=ops.actor(p),
            role=p.identity.role,
        )
        return JoinCodeIssued.model_validate(issued)

    @router.post("/v1/ops/nodes/{name:path}/remove")
    async def node_remove(name: str, p: Annotated[Peer, ops.need("administrator")]) -> NodeRemoved:
        """Its placement groups go, its certificate is revoked, it is told to stop."""
        if ops.on_removed is None:
            raise HTTPException(503, "no node runs here to stop routing to the removed node")
        done = await removed_node(store, name, ops.actor(p), p.identity.role, ops.on_removed)
        return NodeRemoved.model_validate(done)

    return router
