"""Operations only the CLI on the main's own machine asks its running node
(the admin socket): removing a node (a paired administrator removes one
through the admin API, letsinfer.control.ops.nodes); applying what the CLI
wrote to the authority itself (accounts, projects) at once.

The running node applies a removal before it answers: the gateway forgets the
node's placement groups and the node's agent is told to stop its engines.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from letsinfer.control.ops.nodes import OnRemoved, removed_node
from letsinfer.store import AuthorityStore
from letsinfer.trust.peer import gated_peer


def local_router(
    store: AuthorityStore,
    on_removed: OnRemoved,
    on_change: Callable[[], Awaitable[None]] | None = None,
) -> APIRouter:
    router = APIRouter()

    if on_change is not None:
        apply_change = on_change

        @router.post("/v1/local/apply")
        async def apply(request: Request) -> dict[str, bool]:
            """The CLI changed the authority (`user suspend`, `project limits`):
            the gateway's keys follow before this answers."""
            if gated_peer(request).identity.kind != "local":
                raise HTTPException(403, "only the CLI on the main's machine")
            await apply_change()
            return {"applied": True}

    @router.post("/v1/local/nodes/{name:path}/remove")
    async def node_remove(name: str, request: Request) -> dict[str, Any]:
        p = gated_peer(request)
        if p.identity.kind != "local":  # mounted on the admin socket only; said twice
            raise HTTPException(403, "only the CLI on the main's machine removes nodes")
        return await removed_node(store, name, f"local:{p.identity.id}", "main", on_removed)

    return router
