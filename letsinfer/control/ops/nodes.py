"""Nodes: pause (no new work) and resume."""

from typing import Annotated

from fastapi import APIRouter, HTTPException

from letsinfer.authority import lifecycle
from letsinfer.control.ops.answers import NodePaused
from letsinfer.control.ops.context import OpsContext
from letsinfer.trust.peer import Peer


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

    return router
