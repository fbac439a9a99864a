"""The main's controllers from a controller: `auth controller list`, `add`
and `revoke`, with the changes the CLI on the main makes
(letsinfer.authority.controllers). Adding and revoking are an
administrator's: they make and unmake who may act here. A controller does
not revoke itself (409, audited as denied): its own request would cut it
off halfway, and a typo of its own name would lock its workstation out;
another administrator's controller or a shell on the main revokes it."""

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.authority.controllers import (
    MAX_NAME,
    NameTaken,
    RevokeRefused,
    listed,
    new_pairing,
    revoke,
)
from letsinfer.control.ops.answers import ControllerAdded, ControllerListed, ControllerRevoked
from letsinfer.control.ops.context import OpsContext
from letsinfer.store import StoreError
from letsinfer.trust.peer import Peer


class ControllerAdd(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # (a longer name is refused as on the main, with its words: 400)
    name: str = Field("controller", max_length=4 * MAX_NAME)
    role: Literal["viewer", "operator", "administrator"]


class ControllerNamed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, description="A controller's name or id")


def controllers_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["controllers"])
    store = ops.store

    @router.get("/v1/ops/controllers")
    async def controller_list(p: Annotated[Peer, ops.need("viewer")]) -> list[ControllerListed]:
        """Controllers with their role and state."""
        return [ControllerListed.model_validate(c) for c in listed(store)]

    @router.post("/v1/ops/controllers")
    async def controller_add(
        body: ControllerAdd, p: Annotated[Peer, ops.need("administrator")]
    ) -> ControllerAdded:
        """A one-time pairing code for a new controller with this role; the
        name must be free among the controllers not revoked (409)."""
        ttl_s = ops.settings().control.pairing_code_ttl_s
        assert ops.identity.cluster is not None  # (the CA's fingerprint)
        try:
            made = new_pairing(
                store,
                ops.identity.cluster,
                body.role,
                body.name,
                ttl_s,
                actor=ops.actor(p),
                actor_role=p.identity.role,
            )
        except StoreError as exc:
            raise HTTPException(409 if isinstance(exc, NameTaken) else 400, str(exc)) from exc
        return ControllerAdded(
            name=body.name,
            role=body.role,
            code=made.code,
            comparison=made.comparison,
            ttl_s=ttl_s,
        )

    @router.post("/v1/ops/controllers/revoke")
    async def controller_revoke(
        body: ControllerNamed, p: Annotated[Peer, ops.need("administrator")]
    ) -> ControllerRevoked:
        """Revoke a controller (by name or id): its certificate is refused from
        now on. 404: no active controller so named; 409: the caller itself."""
        actor = ops.actor(p)
        try:
            rec = revoke(
                store, body.name, actor=actor, actor_role=p.identity.role, caller_id=p.identity.id
            )
        except RevokeRefused as exc:
            if exc.status == 409:
                store.append_audit(
                    actor,
                    "auth.controller.revoke",
                    "denied",
                    role=p.identity.role,
                    target=body.name,
                    detail="a controller does not revoke itself",
                )
            raise HTTPException(exc.status, str(exc)) from exc
        return ControllerRevoked(name=rec.name, id=rec.id, revoked=True)

    return router
