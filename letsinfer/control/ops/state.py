"""Reading the cluster: nodes, models, placement groups; the main's version."""

from typing import Annotated

from fastapi import APIRouter

from letsinfer import __version__
from letsinfer.control.ops.answers import StateAnswer, VersionAnswer
from letsinfer.control.ops.context import OpsContext
from letsinfer.trust.peer import Peer


def state_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["state"])
    store = ops.store

    @router.get("/v1/ops/state")
    async def state(p: Annotated[Peer, ops.need("viewer")]) -> StateAnswer:
        return StateAnswer.model_validate(
            {
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
                "models": [
                    {"name": s.name, "aliases": list(s.aliases)} for s in store.list_services()
                ],
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
        )

    @router.get("/v1/ops/version")
    async def version(p: Annotated[Peer, ops.need("viewer")]) -> VersionAnswer:
        return VersionAnswer(version=__version__, main=ops.identity.name)

    return router
