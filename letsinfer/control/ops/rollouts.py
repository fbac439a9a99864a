"""Upgrade, rollback, canaries and model removal from a controller: the same
work the CLI on the main asks its admin socket for (letsinfer.lifecycle.routes), run where
the main's gateway drains and proves groups: on the gateway's loop, not the
control plane's thread. Each answers when the rollout has finished."""

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeVar

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.control.ops.answers import (
    CanaryAnswer,
    ClusterRestarted,
    ClusterStarted,
    ClusterStopped,
    ModelRemoved,
    RolloutAnswer,
)
from letsinfer.control.ops.context import OpsContext
from letsinfer.lifecycle import canary
from letsinfer.lifecycle.rollout import RolloutRefused
from letsinfer.trust.peer import Peer

T = TypeVar("T")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GateBody(_Body):
    """A gate for this rollout (letsinfer.evals.gate): a built-in suite's name,
    or a suite file's path and its text as the CLI read it."""

    suite: str = Field(max_length=4096)
    min_score: float = Field(ge=0.0, le=1.0)
    text: str | None = Field(None, max_length=4 * 1024 * 1024)


class Upgrade(_Body):
    release: str = Field(max_length=200)
    nodes: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=256)
    # The gate its first replacement must pass (None: the model's own, if any).
    gate: GateBody | None = None
    # One new group takes this share (percent) of the model's requests until
    # promoted or aborted (letsinfer.lifecycle.canary); None: a whole upgrade.
    canary: float | None = Field(None, gt=0, lt=100)


class Rollback(_Body):
    to: str | None = Field(None, max_length=200)
    nodes: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=256)


class Update(_Body):
    """New weights of a model (`model update`), already verified and in the
    main's model store."""

    sha256: str = Field(pattern="^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    # repo, revision, commit, files: as `model pull` records it
    origin: dict[str, Any] | None = None
    nodes: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=256)
    gate: GateBody | None = None  # None: the model's own gate, if it has one
    # One new group on them takes this share (percent) of the model's requests
    # until promoted or aborted (letsinfer.lifecycle.canary); None: every group.
    canary: float | None = Field(None, gt=0, lt=100)


class WeightsRollback(_Body):
    to: str = Field(max_length=200)  # a commit (7+ characters) or sha256:DIGEST
    nodes: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=256)


class Replacement(_Body):
    group: str = Field(max_length=64)
    release: str = Field(max_length=200)
    gpus: list[str] = Field(default_factory=list, max_length=64)


class Replace(_Body):
    """`model install --replace-existing`: each group replaced by a new one
    with a release already recorded (letsinfer.admission.install)."""

    replacements: list[Replacement] = Field(max_length=256)


class Remove(_Body):
    # Also when its groups run: they drain and stop first.
    stop: bool = False


ClusterVerb = Literal["stop", "start", "restart"]


class Rollouts(Protocol):
    async def upgrade(self, name: str, body: Upgrade, actor: str, role: str) -> dict[str, Any]:
        """The rollout's result (or HTTPException: refused, busy, not found)."""

    async def rollback(self, name: str, body: Rollback, actor: str, role: str) -> dict[str, Any]:
        """The rollout's result (or HTTPException)."""

    async def update_weights(
        self, name: str, body: Update, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        """`model update`'s rollout of weights in the model store (or HTTPException)."""

    async def rollback_weights(
        self, name: str, body: WeightsRollback, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        """`model rollback --weights`'s rollout (or HTTPException)."""

    async def promote(self, name: str, actor: str, role: str) -> dict[str, Any]:
        """The rest of the rollout's result (or HTTPException)."""

    async def abort(self, name: str, actor: str, role: str) -> dict[str, Any]:
        """The canary's removal (or HTTPException)."""

    async def remove(
        self, name: str, body: Remove, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        """The model's removal, after its running groups drained (or HTTPException)."""

    async def cluster(self, verb: ClusterVerb, actor: str, role: str) -> dict[str, Any]:
        """`cluster stop|start|restart`'s result, once its engines answered (or HTTPException)."""

    async def replace(self, name: str, body: Replace, actor: str, role: str) -> dict[str, Any]:
        """`model install --replace-existing`'s rollout (or HTTPException)."""

    async def reload(self, name: str, actor: str, role: str) -> dict[str, Any] | None:
        """The model's groups restarted one at a time with its adapters as they
        are now; None: no gateway runs here (they load them when it starts)."""


class OnLoop:
    """``rollouts`` run on ``loop`` (the gateway's), awaited from another
    thread's loop (the control plane's). A controller that hangs up does not
    stop a rollout midway: its groups would be left half replaced."""

    def __init__(self, rollouts: Rollouts, loop: asyncio.AbstractEventLoop) -> None:
        self.rollouts = rollouts
        self.loop = loop

    async def _there(self, work: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await work()

        done = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return await asyncio.shield(asyncio.wrap_future(done))

    async def upgrade(self, name: str, body: Upgrade, actor: str, role: str) -> dict[str, Any]:
        return await self._there(lambda: self.rollouts.upgrade(name, body, actor, role))

    async def rollback(self, name: str, body: Rollback, actor: str, role: str) -> dict[str, Any]:
        return await self._there(lambda: self.rollouts.rollback(name, body, actor, role))

    async def update_weights(
        self, name: str, body: Update, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        return await self._there(
            lambda: self.rollouts.update_weights(name, body, model_store, actor, role)
        )

    async def rollback_weights(
        self, name: str, body: WeightsRollback, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        return await self._there(
            lambda: self.rollouts.rollback_weights(name, body, model_store, actor, role)
        )

    async def promote(self, name: str, actor: str, role: str) -> dict[str, Any]:
        return await self._there(lambda: self.rollouts.promote(name, actor, role))

    async def abort(self, name: str, actor: str, role: str) -> dict[str, Any]:
        return await self._there(lambda: self.rollouts.abort(name, actor, role))

    async def remove(
        self, name: str, body: Remove, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        return await self._there(lambda: self.rollouts.remove(name, body, model_store, actor, role))

    async def cluster(self, verb: ClusterVerb, actor: str, role: str) -> dict[str, Any]:
        # (shielded as a rollout: a cluster left half stopped serves no one)
        return await self._there(lambda: self.rollouts.cluster(verb, actor, role))

    async def replace(self, name: str, body: Replace, actor: str, role: str) -> dict[str, Any]:
        return await self._there(lambda: self.rollouts.replace(name, body, actor, role))

    async def reload(self, name: str, actor: str, role: str) -> dict[str, Any] | None:
        return await self._there(lambda: self.rollouts.reload(name, actor, role))


class NoRollouts:
    """Where no gateway runs beside the authority (a plane built for tests)."""

    async def upgrade(self, name: str, body: Upgrade, actor: str, role: str) -> dict[str, Any]:
        from fastapi import HTTPException

        raise HTTPException(503, "no gateway runs here to drain and prove placement groups")

    async def rollback(self, name: str, body: Rollback, actor: str, role: str) -> dict[str, Any]:
        return await self.upgrade(name, Upgrade(release="-"), actor, role)

    async def update_weights(
        self, name: str, body: Update, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        return await self.upgrade(name, Upgrade(release="-"), actor, role)

    async def rollback_weights(
        self, name: str, body: WeightsRollback, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        return await self.upgrade(name, Upgrade(release="-"), actor, role)

    async def promote(self, name: str, actor: str, role: str) -> dict[str, Any]:
        return await self.upgrade(name, Upgrade(release="-"), actor, role)

    async def abort(self, name: str, actor: str, role: str) -> dict[str, Any]:
        return await self.upgrade(name, Upgrade(release="-"), actor, role)

    async def remove(
        self, name: str, body: Remove, model_store: Path, actor: str, role: str
    ) -> dict[str, Any]:
        return await self.upgrade(name, Upgrade(release="-"), actor, role)

    async def cluster(self, verb: ClusterVerb, actor: str, role: str) -> dict[str, Any]:
        return await self.upgrade("-", Upgrade(release="-"), actor, role)

    async def replace(self, name: str, body: Replace, actor: str, role: str) -> dict[str, Any]:
        return await self.upgrade(name, Upgrade(release="-"), actor, role)

    async def reload(self, name: str, actor: str, role: str) -> dict[str, Any] | None:
        return None


def rollouts_router(ops: OpsContext, rollouts: Rollouts) -> APIRouter:
    router = APIRouter(tags=["models"])

    def model_store() -> Path:
        if ops.home is None:
            raise HTTPException(503, "this plane has no model store to roll weights from")
        return ops.home.model_store

    @router.post("/v1/ops/models/{name:path}/upgrade")
    async def upgrade(
        name: str, body: Upgrade, p: Annotated[Peer, ops.need("operator")]
    ) -> RolloutAnswer:
        done = await rollouts.upgrade(name, body, ops.actor(p), p.identity.role)
        return RolloutAnswer.model_validate(done)

    @router.post("/v1/ops/models/{name:path}/rollback")
    async def rollback(
        name: str, body: Rollback, p: Annotated[Peer, ops.need("operator")]
    ) -> RolloutAnswer:
        done = await rollouts.rollback(name, body, ops.actor(p), p.identity.role)
        return RolloutAnswer.model_validate(done)

    @router.post("/v1/ops/models/{name:path}/rollback-weights")
    async def rollback_weights(
        name: str, body: WeightsRollback, p: Annotated[Peer, ops.need("operator")]
    ) -> RolloutAnswer:
        """The model's weights go back to ones it ran before (kept in the
        model store, never downloaded again); its release stays."""
        done = await rollouts.rollback_weights(
            name, body, model_store(), ops.actor(p), p.identity.role
        )
        return RolloutAnswer.model_validate(done)

    @router.post("/v1/ops/models/{name:path}/promote")
    async def promote(name: str, p: Annotated[Peer, ops.need("operator")]) -> RolloutAnswer:
        """The model's canary stays and the rest of its groups follow it."""
        done = await rollouts.promote(name, ops.actor(p), p.identity.role)
        return RolloutAnswer.model_validate(done)

    @router.post("/v1/ops/models/{name:path}/abort")
    async def abort(name: str, p: Annotated[Peer, ops.need("operator")]) -> RolloutAnswer:
        """The model's canary group goes; every request returns to the others."""
        done = await rollouts.abort(name, ops.actor(p), p.identity.role)
        return RolloutAnswer.model_validate(done)

    @router.post("/v1/ops/models/{name:path}/remove")
    async def remove(
        name: str, body: Remove, p: Annotated[Peer, ops.need("administrator")]
    ) -> ModelRemoved:
        """The model, its groups, its release history and its LoRA adapters go;
        its file too when no other model uses those bytes. Refused while its
        groups should run, unless ``stop`` (they drain first)."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no model store to remove from")
        done = await rollouts.remove(
            name, body, ops.home.model_store, ops.actor(p), p.identity.role
        )
        return ModelRemoved.model_validate(done)

    @router.post("/v1/ops/cluster/stop")
    async def cluster_stop(p: Annotated[Peer, ops.need("operator")]) -> ClusterStopped:
        """New requests are refused (503 system_stopped), those in flight
        finish, then every placement group stops; remembered for start."""
        done = await rollouts.cluster("stop", ops.actor(p), p.identity.role)
        return ClusterStopped.model_validate(done)

    @router.post("/v1/ops/cluster/start")
    async def cluster_start(p: Annotated[Peer, ops.need("operator")]) -> ClusterStarted:
        """The groups `cluster stop` stopped start again; answers once each is
        ready or said why not."""
        done = await rollouts.cluster("start", ops.actor(p), p.identity.role)
        return ClusterStarted.model_validate(done)

    @router.post("/v1/ops/cluster/restart")
    async def cluster_restart(p: Annotated[Peer, ops.need("operator")]) -> ClusterRestarted:
        """Every engine afresh, node by node, one group at a time, each proven
        before the next."""
        done = await rollouts.cluster("restart", ops.actor(p), p.identity.role)
        return ClusterRestarted.model_validate(done)

    @router.get("/v1/ops/models/{name:path}/canary")
    async def canary_report(name: str, p: Annotated[Peer, ops.need("viewer")]) -> CanaryAnswer:
        """Both sides of the model's canary: requests, errors, latency, evals."""
        try:
            done = canary.report(ops.store, ops.home.requests_database if ops.home else None, name)
        except RolloutRefused as exc:
            raise HTTPException(exc.status, str(exc)) from exc
        return CanaryAnswer.model_validate(done)

    return router
