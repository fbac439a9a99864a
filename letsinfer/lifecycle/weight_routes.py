"""``model update`` and ``model rollback --weights`` on the main's admin
socket: rollouts of other weights, run on the gateway's loop (where groups
drain and are proven, and where a gate's eval requests are served) like the
upgrades of letsinfer.lifecycle.routes. The CLI has downloaded and verified
the new weights and put them in the model store before it asks."""

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from letsinfer.control.ops.roles import actor_of, role_check
from letsinfer.control.ops.rollouts import Update, WeightsRollback
from letsinfer.evals.gate import Gates, gate_for
from letsinfer.lifecycle import weights
from letsinfer.lifecycle.exclusive import exclusively
from letsinfer.lifecycle.serving import Serving
from letsinfer.trust.peer import Peer


async def update_weights(
    sv: Serving,
    model_store: Path,
    gates: Gates | None,
    name: str,
    body: Update,
    actor: str,
    role: str,
) -> dict[str, Any]:
    """`model update`'s rollout (or its canary), one at a time with the
    main's other rollouts: for the admin socket and for controllers."""

    async def work() -> dict[str, Any]:
        svc = weights.served_model(sv.store, name)
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


async def rollback_weights(
    sv: Serving, model_store: Path, name: str, body: WeightsRollback, actor: str, role: str
) -> dict[str, Any]:
    """`model rollback --weights`: for the admin socket and for controllers."""

    async def work() -> dict[str, Any]:
        target = weights.rollback_target(sv.store, model_store, name, body.to)
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


def weights_router(sv: Serving, model_store: Path, gates: Gates | None) -> APIRouter:
    router = APIRouter()
    store = sv.store
    Operator = Annotated[Peer, Depends(role_check(store, "operator"))]

    @router.post("/v1/ops/models/{name:path}/update")
    async def update(name: str, body: Update, p: Operator) -> dict[str, Any]:
        return await update_weights(
            sv, model_store, gates, name, body, actor_of(store, p), p.identity.role
        )

    @router.post("/v1/ops/models/{name:path}/rollback-weights")
    async def rollback(name: str, body: WeightsRollback, p: Operator) -> dict[str, Any]:
        return await rollback_weights(
            sv, model_store, name, body, actor_of(store, p), p.identity.role
        )

    return router
