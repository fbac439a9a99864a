"""Lifecycle operations a running main performs itself (they drain through its
gateway and wait on its agents): on the admin socket, for the CLI on the
main's machine. Each answers when the operation has finished."""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.authority import lifecycle
from letsinfer.control.ops.roles import actor_of, role_check
from letsinfer.control.ops.rollouts import Rollback, Upgrade
from letsinfer.lifecycle import adapters, cluster, rollout
from letsinfer.lifecycle.serving import Busy, Serving
from letsinfer.trust.peer import Peer


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Replacement(_Body):
    group: str = Field(max_length=64)
    release: str = Field(max_length=200)
    gpus: list[str] = Field(default_factory=list, max_length=64)


class Replace(_Body):
    replacements: list[Replacement] = Field(max_length=256)


class Remove(_Body):
    stop: bool = False


async def exclusively(sv: Serving, what: str, work: Callable[[], Awaitable[Any]]) -> Any:
    """``work`` alone (one lifecycle operation at a time), its refusals as HTTP."""
    try:
        async with sv.exclusive(what):
            return await work()
    except Busy as exc:
        raise HTTPException(409, str(exc)) from exc
    except rollout.RolloutRefused as exc:
        raise HTTPException(exc.status, f"{exc}. Nothing changed.") from exc
    except lifecycle.NotFound as exc:
        raise HTTPException(404, f"{exc}. Nothing changed.") from exc
    except lifecycle.Refused as exc:
        raise HTTPException(409, f"{exc}. Nothing changed.") from exc


class ServingRollouts:
    """Upgrade and rollback on the main's gateway loop: for the CLI on the main
    (the admin socket) and, through letsinfer.control.ops.rollouts, for
    controllers. One implementation, so both refuse and answer alike."""

    def __init__(self, sv: Serving) -> None:
        self.sv = sv

    async def upgrade(self, name: str, body: Upgrade, actor: str, role: str) -> dict[str, Any]:
        sv = self.sv

        async def work() -> dict[str, Any]:
            model, changes = rollout.upgrade_changes(sv, name, body.release, body.nodes)
            result = await rollout.run(
                sv, model, "model.upgrade", "upgraded", changes, actor=actor, role=role
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


def lifecycle_router(sv: Serving, model_store: Path) -> APIRouter:
    router = APIRouter()
    store = sv.store

    Operator = Annotated[Peer, Depends(role_check(store, "operator"))]
    Administrator = Annotated[Peer, Depends(role_check(store, "administrator"))]
    rollouts = ServingRollouts(sv)

    async def exclusive(what: str, work: Callable[[], Awaitable[Any]]) -> Any:
        return await exclusively(sv, what, work)

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

    @router.post("/v1/ops/models/{name:path}/replace")
    async def replace(name: str, body: Replace, p: Operator) -> dict[str, Any]:
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
                sv,
                model,
                "model.install",
                "replaced",
                changes,
                actor=actor_of(store, p),
                role=p.identity.role,
            )
            return result.to_json()

        return await exclusive(f"replacement in {name}", work)  # type: ignore[no-any-return]

    @router.post("/v1/ops/models/{name:path}/remove")
    async def remove(name: str, body: Remove, p: Administrator) -> dict[str, Any]:
        async def work() -> dict[str, Any]:
            svc = store.resolve_service(name)
            running = set(lifecycle.running_groups(store, svc.name)) if svc else set()
            if body.stop and running:  # a refusal that needs no drain comes first
                lifecycle.refuse_stranding_keys(
                    store, name, actor=actor_of(store, p), role=p.identity.role
                )
            cut = await sv.drain(running) if body.stop and running else 0
            try:
                done = lifecycle.remove_model(
                    store,
                    model_store,
                    name,
                    stop=body.stop,
                    actor=actor_of(store, p),
                    role=p.identity.role,
                )
            finally:
                sv.apply()
                sv.routing.undrain(running)
            return {**done.to_json(), "cut": cut}

        return await exclusive(f"removal of {name}", work)  # type: ignore[no-any-return]

    @router.post("/v1/ops/models/{name:path}/reload")
    async def reload(name: str, p: Operator) -> dict[str, Any]:
        """The model's groups start afresh one at a time (its LoRA adapters changed)."""
        return await exclusive(  # type: ignore[no-any-return]
            f"reload of {name}",
            lambda: adapters.reload(sv, name, actor=actor_of(store, p), role=p.identity.role),
        )

    @router.post("/v1/ops/cluster/stop")
    async def cluster_stop(p: Operator) -> dict[str, Any]:
        return await exclusive(  # type: ignore[no-any-return]
            "cluster stop",
            lambda: cluster.stop(sv, actor=actor_of(store, p), role=p.identity.role),
        )

    @router.post("/v1/ops/cluster/start")
    async def cluster_start(p: Operator) -> dict[str, Any]:
        return await exclusive(  # type: ignore[no-any-return]
            "cluster start",
            lambda: cluster.start(sv, actor=actor_of(store, p), role=p.identity.role),
        )

    @router.post("/v1/ops/cluster/restart")
    async def cluster_restart(p: Operator) -> dict[str, Any]:
        return await exclusive(  # type: ignore[no-any-return]
            "cluster restart",
            lambda: cluster.restart(sv, actor=actor_of(store, p), role=p.identity.role),
        )

    return router
