"""The main's controllers from a controller: `auth controller list`. Pairing
and revoking stay on the main (they make and unmake who may act here)."""

from typing import Annotated

from fastapi import APIRouter

from letsinfer.authority.controllers import listed
from letsinfer.control.ops.answers import ControllerListed
from letsinfer.control.ops.context import OpsContext
from letsinfer.trust.peer import Peer


def controllers_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["controllers"])

    @router.get("/v1/ops/controllers")
    async def controller_list(p: Annotated[Peer, ops.need("viewer")]) -> list[ControllerListed]:
        """Controllers with their role and state."""
        return [ControllerListed.model_validate(c) for c in listed(ops.store)]

    return router
