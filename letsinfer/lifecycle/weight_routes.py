"""``model update`` and ``model rollback --weights`` on the main's admin
socket: rollouts of other weights, run on the gateway's loop (where groups
drain and are proven, and where a gate's eval requests are served) like the
upgrades of letsinfer.lifecycle.routes. The CLI has downloaded and verified
the new weights and put them in the model store before it asks."""

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.control.ops.roles import actor_of, role_check
from letsinfer.control.ops.rollouts import GateBody
from letsinfer.evals.gate import Gates, gate_for
from letsinfer.lifecycle import weights
from letsinfer.lifecycle.exclusive import exclusively
from letsinfer.lifecycle.serving import Serving
from letsinfer.trust.peer import Peer

Nodes = list[Annotated[str, Field(max_length=200)]]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Update(_Body):
    sha256: str = Field(pattern="^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    # repo, revision, commit, files: as `model pull` records it
    origin: dict[str, Any] | None = None
    nodes: Nodes = Field(default_factory=list, max_length=256)
    gate: GateBody | None = None  # None: the model's own gate, if it has one
    # One new group on them takes this share (percent) of the model's requests
    # until promoted or aborted (letsinfer.lifecycle.canary); None: every group.
    canary: float | None = Field(None, gt=0, lt=100)


class WeightsRollback(_Body):
    to: str = Field(max_length=200)  # a commit (7+ characters) or sha256:DIGEST
    nodes: Nodes = Field(default_factory=list, max_length=256)


def weights_router(sv: Serving, model_store: Path, gates: Gates | None) -> APIRouter:
    router = APIRouter()
    store = sv.store
    Operator = Annotated[Peer, Depends(role_check(store, "operator"))]

    @router.post("/v1/ops/models/{name:path}/update")
    async def update(name: str, body: Update, p: Operator) -> dict[str, Any]:
        actor, role = actor_of(store, p), p.identity.role

        async def work() -> dict[str, Any]:
            svc = weights.served_model(store, name)
            vet = gate_for(gates, sv, svc.name, body.gate, actor=actor, role=role)
            new = weights.Weights(body.sha256, body.size, body.origin)
            if body.canary is not None:
                return await weights.start_canary(
                    sv,
                    model_store,
                    svc.name,
                    new,
                    body.canary,
                    nodes=body.nodes,
                    vet=vet,
                    actor=actor,
                    role=role,
                )
            return await weights.roll(
                sv,
                model_store,
                svc.name,
                new,
                action=weights.UPDATE,
                event="updated",
                nodes=body.nodes,
                vet=vet,
                actor=actor,
                role=role,
            )

        return await exclusively(sv, f"update of {name}", work)  # type: ignore[no-any-return]

    @router.post("/v1/ops/models/{name:path}/rollback-weights")
    async def rollback_weights(name: str, body: WeightsRollback, p: Operator) -> dict[str, Any]:
        actor, role = actor_of(store, p), p.identity.role

        async def work() -> dict[str, Any]:
            target = weights.rollback_target(store, model_store, name, body.to)
            return await weights.roll(
                sv,
                model_store,
                name,
                target,
                action=weights.ROLLBACK,
                event="rolled back",
                nodes=body.nodes,
                vet=None,  # back to weights that served: no gate
                actor=actor,
                role=role,
            )

        return await exclusively(sv, f"rollback of {name}'s weights", work)  # type: ignore[no-any-return]

    return router
