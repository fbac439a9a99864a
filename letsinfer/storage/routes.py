"""``node usage`` and ``node cleanup`` asked of the running node (admin socket).

The running node answers from what it knows now (its engines, and its main's
word on its groups), and a cleanup is reviewed and applied in one step of its
event loop, so no engine of it starts in between.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict

from letsinfer.home import Home
from letsinfer.storage.cleanup import free, review, summary
from letsinfer.storage.usage import report
from letsinfer.storage.uses import NodeUses
from letsinfer.store import AuthorityStore
from letsinfer.trust.peer import gated_peer


class CleanupAsk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    apply: bool = False


NOT_KNOWN = (
    "this node has not heard from its main yet, so it cannot tell what its placement "
    "groups need; try again once it has. Nothing changed."
)


def storage_router(
    home: Home,
    node_name: Callable[[], str],
    uses: Callable[[], NodeUses],
    audit: AuthorityStore,
    after_cleanup: Callable[[], Awaitable[None]],
) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/local/storage")
    async def usage() -> dict[str, Any]:
        return report(home, uses(), node_name())

    @router.post("/v1/local/storage/cleanup")
    async def cleanup(body: CleanupAsk, request: Request) -> dict[str, Any]:
        now = uses()
        if not now.known:
            raise HTTPException(409, NOT_KNOWN)
        releases = review(home, now)
        if not body.apply:
            return summary(releases, None)
        freed = free(home, releases)
        audit.append_audit(
            f"local:{gated_peer(request).identity.id}",
            "node.cleanup",
            "ok",
            target=node_name(),
            detail=f"freed {len(freed)} file(s), {sum(r.bytes for r in freed)} bytes: "
            + ", ".join(r.path for r in freed)[:900],
        )
        if freed:
            await after_cleanup()  # the main learns what this node holds now
        return summary(releases, freed)

    return router
