"""Operations only the CLI on the main's own machine may ask its running node
(the admin socket), never a paired controller: removing a node; applying
what the CLI wrote to the authority itself (accounts, projects) at once.

The running node applies a removal before it answers: the gateway forgets the
node's placement groups and the node's agent is told to stop its engines.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from letsinfer.authority.removal import Removal, RemovalRefused, remove_node
from letsinfer.store import AuthorityStore
from letsinfer.trust.peer import gated_peer

# After the removal committed: stop routing, tell the node; returns what the node said.
OnRemoved = Callable[[Removal], Awaitable[dict[str, Any]]]


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
        actor = f"local:{p.identity.id}"
        if p.identity.kind != "local":  # mounted on the admin socket only; said twice
            raise HTTPException(403, "only the CLI on the main's machine removes nodes")
        try:
            removal = remove_node(store, name, actor=actor)
        except RemovalRefused as exc:
            store.append_audit(actor, "node.remove", "denied", target=name, detail=str(exc))
            status = 404 if str(exc).startswith("no node") else 409
            raise HTTPException(status, f"{exc}. Nothing changed.") from exc
        return {**removal.to_json(), **(await on_removed(removal))}

    return router
