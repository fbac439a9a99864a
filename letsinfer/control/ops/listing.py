"""The cluster as the main's displays show it: `node list`, `model list`,
`model show`, `cluster status`, `topology` and `release list` from a controller, each
object the one the CLI on the main prints (letsinfer.authority.views), every
state from the same scene (letsinfer.authority.states) the running main would
give its own CLI."""

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, HTTPException

from letsinfer import config
from letsinfer.authority.states import Scene
from letsinfer.authority.views import (
    cluster_object,
    model_object,
    node_object,
    release_rows,
    shown_model,
    topology_objects,
)
from letsinfer.control.ops.answers import (
    ClusterShown,
    ModelShown,
    NodeShown,
    ReleaseShown,
    TopologyNode,
)
from letsinfer.control.ops.context import OpsContext
from letsinfer.store import StoreError
from letsinfer.trust.peer import Peer

# The groups the main drains now, how long a child may go unheard and the
# state of its exposure's TLS port: what only the running main knows (its
# admin socket's /v1/local/scene and /v1/local/exposure).
SceneFacts = Callable[[], Awaitable[tuple[list[str], float, dict[str, object]]]]


def listing_router(ops: OpsContext, facts: SceneFacts | None) -> APIRouter:
    router = APIRouter(tags=["state"])
    store = ops.store

    async def scene() -> Scene:
        if facts is not None:
            draining, stale_after_s, _ = await facts()
        else:  # no gateway beside this plane: the settings' word
            draining = []
            stale_after_s = (
                config.load(ops.home.config_file).control.node_stale_after_s
                if ops.home is not None
                else config.ControlSettings().node_stale_after_s
            )
        return Scene.read(store, main_running=True, draining=draining, stale_after_s=stale_after_s)

    @router.get("/v1/ops/nodes")
    async def nodes(p: Annotated[Peer, ops.need("viewer")], all: bool = False) -> list[NodeShown]:
        """``all``: removed nodes too (kept for the record)."""
        seen = await scene()
        return [
            NodeShown.model_validate(node_object(seen, n))
            for n in store.list_nodes(include_removed=all)
        ]

    @router.get("/v1/ops/cluster")
    async def cluster(p: Annotated[Peer, ops.need("viewer")]) -> ClusterShown:
        return ClusterShown.model_validate(cluster_object(store, await scene()))

    @router.get("/v1/ops/topology")
    async def topology(p: Annotated[Peer, ops.need("viewer")]) -> list[TopologyNode]:
        """Nodes, their GPUs, the placement groups on them and their data links."""
        seen = await scene()
        return [TopologyNode.model_validate(n) for n in topology_objects(store, seen)]

    @router.get("/v1/ops/releases")
    async def releases(p: Annotated[Peer, ops.need("viewer")]) -> list[ReleaseShown]:
        return [ReleaseShown.model_validate(r) for r in release_rows(store)]

    @router.get("/v1/ops/models")
    async def models(p: Annotated[Peer, ops.need("viewer")]) -> list[ModelShown]:
        seen = await scene()
        return [
            ModelShown.model_validate(model_object(store, seen, s)) for s in store.list_services()
        ]

    @router.get("/v1/ops/models/{name:path}/show")
    async def model_show(name: str, p: Annotated[Peer, ops.need("viewer")]) -> ModelShown:
        seen = await scene()
        try:
            return ModelShown.model_validate(shown_model(store, seen, name))
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc

    return router
