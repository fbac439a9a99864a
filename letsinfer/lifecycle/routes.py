"""Lifecycle operations a running main performs itself (they drain through its
gateway and wait on its agents): on the admin socket, for the CLI on the
main's machine. Each answers when the operation has finished."""

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from letsinfer.authority import lifecycle
from letsinfer.control.ops.roles import actor_of, role_check
from letsinfer.control.ops.rollouts import (
    ClusterVerb,
    Remove,
    Replace,
    Rollback,
    Update,
    Upgrade,
    WeightsRollback,
)
from letsinfer.evals.gate import Gates, gate_for
from letsinfer.home import Home
from letsinfer.lifecycle import adapters, canary, cluster, rollout
from letsinfer.lifecycle.exclusive import exclusively
from letsinfer.lifecycle.serving import Serving
from letsinfer.lifecycle.weight_routes import rollback_weights, update_weights, weights_router
from letsinfer.trust.peer import Peer


class ServingRollouts:
    """Upgrade, rollback, canaries and removal on the main's gateway loop: for the CLI on the main
    (the admin socket) and, through letsinfer.control.ops.rollouts, for
    controllers. One implementation, so both refuse and answer alike."""

    def __init__(self, sv: Serving, gates: Gates | None = None) -> None:
        self.sv = sv
        self.gates = gates  # None: no gate can run here (letsinfer.evals.gate)

    async def upgrade(self, name: str, body: Upgrade, actor: str, role: str) -> dict[str, Any]:
        sv = self.sv

        async def work() -> dict[str, Any]:
            model, changes = rollout.upgrade_changes(sv, name, body.release, body.nodes)
            vet = gate_for(self.gates, sv, model, body.gate, actor=actor, role=role)
            if body.canary is not None:
                started = await canary.start_release_canary(
                    sv, name, body.release, body.canary, body.nodes, actor=actor, role=role, vet=vet
                )
                return started.to_json()
            result = await rollout.run(
                sv, model, "model.upgrade", "upgraded", changes, actor=actor, role=role, vet=vet
            )
            return result.to_json()

        return await exclusively(sv, f"upgrade of {name}", work)  # type: ignore[no-any-return]

    async def rollback(self, name: str, body: Rollback, actor: str, role: str) -> dict[str, Any]:
        sv = self.sv

        async def work() -> dict[str, Any]:
            model, changes, skipped = rollout.rollback_changes(sv, name, body.to, body.nodes)
            result = await rollout.run(
                sv,
                model,
                "model.rollback",
                "rolled back",
                changes,
                actor=actor,
                role=role,
                skipped=skipped,
            )
            return result.to_json()

        return await exclusively(sv, f"rollback of {name}", work)  # type: ignore[no-any-return]

    async def update_weights(
        self, name: str, body: Update, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        return await update_weights(self.sv, model_store, self.gates, name, body, actor, role)

    async def rollback_weights(
        self, name: str, body: WeightsRollback, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        return await rollback_weights(self.sv, model_store, name, body, actor, role)

    async def promote(self, name: str, actor: str, role: str) -> dict[str, Any]:
        sv = self.sv

        async def work() -> dict[str, Any]:
            model = canary.open_canary_of(sv.store, name).service
            vet = gate_for(self.gates, sv, model, None, actor=actor, role=role)
            return (await canary.promote(sv, name, actor=actor, role=role, vet=vet)).to_json()

        return await exclusively(sv, f"promotion of {name}", work)  # type: ignore[no-any-return]

    async def abort(self, name: str, actor: str, role: str) -> dict[str, Any]:
        sv = self.sv

        async def work() -> dict[str, Any]:
            return (await canary.abort(sv, name, actor=actor, role=role)).to_json()

        return await exclusively(sv, f"canary abort of {name}", work)  # type: ignore[no-any-return]

    async def remove(
        self, name: str, body: Remove, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        sv = self.sv
        store = sv.store

        async def work() -> dict[str, Any]:
            svc = store.resolve_service(name)
            running = set(lifecycle.running_groups(store, svc.name)) if svc else set()
            if body.stop and running:  # a refusal that needs no drain comes first
                lifecycle.refuse_stranding_keys(store, name, actor=actor, role=role)
            cut = await sv.drain(running) if body.stop and running else 0
            try:
                done = lifecycle.remove_model(
                    store, model_store, name, stop=body.stop, actor=actor, role=role
                )
            finally:
                sv.apply()
                sv.routing.undrain(running)
            return {**done.to_json(), "cut": cut}

        return await exclusively(sv, f"removal of {name}", work)  # type: ignore[no-any-return]

    async def replace(self, name: str, body: Replace, actor: str, role: str) -> dict[str, Any]:
        sv = self.sv
        store = sv.store

        async def work() -> dict[str, Any]:
            changes = []
            for r in body.replacements:
                pg = store.get_placement_group(r.group)
                if pg is None or store.resolve_service(name) is None:
                    raise rollout.RolloutRefused(f"no placement group {r.group} of {name}", 404)
                rollout.check_release(sv, r.release)
                changes.append(rollout.Change(pg, r.release, tuple(r.gpus)))
            model = changes[0].group.service if changes else name
            result = await rollout.run(
                sv, model, "model.install", "replaced", changes, actor=actor, role=role
            )
            return result.to_json()

        return await exclusively(sv, f"replacement in {name}", work)  # type: ignore[no-any-return]

    async def reload(self, name: str, actor: str, role: str) -> dict[str, Any] | None:
        sv = self.sv
        return await exclusively(  # type: ignore[no-any-return]
            sv, f"reload of {name}", lambda: adapters.reload(sv, name, actor=actor, role=role)
        )

    async def cluster(self, verb: ClusterVerb, actor: str, role: str) -> dict[str, Any]:
        sv = self.sv
        run = {"stop": cluster.stop, "start": cluster.start, "restart": cluster.restart}[verb]
        return await exclusively(  # type: ignore[no-any-return]
            sv, f"cluster {verb}", lambda: run(sv, actor=actor, role=role)
        )


def lifecycle_router(sv: Serving, home: Home) -> APIRouter:
    router = APIRouter()
    store = sv.store
    model_store = home.model_store
    gates = Gates(home)
    router.include_router(weights_router(sv, model_store, gates))

    Operator = Annotated[Peer, Depends(role_check(store, "operator"))]
    Administrator = Annotated[Peer, Depends(role_check(store, "administrator"))]
    rollouts = ServingRollouts(sv, gates)

    @router.get("/v1/local/scene")
    async def scene() -> dict[str, Any]:
        """What displays need beside the authority (letsinfer.authority.states):
        the groups leaving service now, which only this process knows, and when
        a child counts as unreachable (later while the main was too busy to
        hear its nodes)."""
        return {
            "draining": sorted(sv.routing.draining()),
            "stale_after_s": sv.shown_stale_after_s,
        }

    @router.post("/v1/ops/models/{name:path}/upgrade")
    async def upgrade(name: str, body: Upgrade, p: Operator) -> dict[str, Any]:
        return await rollouts.upgrade(name, body, actor_of(store, p), p.identity.role)

    @router.post("/v1/ops/models/{name:path}/rollback")
    async def rollback(name: str, body: Rollback, p: Operator) -> dict[str, Any]:
        return await rollouts.rollback(name, body, actor_of(store, p), p.identity.role)

    @router.post("/v1/ops/models/{name:path}/promote")
    async def promote(name: str, p: Operator) -> dict[str, Any]:
        return await rollouts.promote(name, actor_of(store, p), p.identity.role)

    @router.post("/v1/ops/models/{name:path}/abort")
    async def abort(name: str, p: Operator) -> dict[str, Any]:
        return await rollouts.abort(name, actor_of(store, p), p.identity.role)

    @router.post("/v1/ops/models/{name:path}/replace")
    async def replace(name: str, body: Replace, p: Operator) -> dict[str, Any]:
        return await rollouts.replace(name, body, actor_of(store, p), p.identity.role)

    @router.post("/v1/ops/models/{name:path}/remove")
    async def remove(name: str, body: Remove, p: Administrator) -> dict[str, Any]:
        return await rollouts.remove(name, body, model_store, actor_of(store, p), p.identity.role)

    @router.post("/v1/ops/models/{name:path}/reload")
    async def reload(name: str, p: Operator) -> dict[str, Any]:
        """The model's groups start afresh one at a time (its LoRA adapters changed)."""
        return await rollouts.reload(name, actor_of(store, p), p.identity.role)  # type: ignore[return-value]

    @router.post("/v1/ops/cluster/stop")
    async def cluster_stop(p: Operator) -> dict[str, Any]:
        return await rollouts.cluster("stop", actor_of(store, p), p.identity.role)

    @router.post("/v1/ops/cluster/start")
    async def cluster_start(p: Operator) -> dict[str, Any]:
        return await rollouts.cluster("start", actor_of(store, p), p.identity.role)

    @router.post("/v1/ops/cluster/restart")
    async def cluster_restart(p: Operator) -> dict[str, Any]:
        return await rollouts.cluster("restart", actor_of(store, p), p.identity.role)

    return router
