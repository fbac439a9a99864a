"""Upgrade and rollback from a controller: the same rollout the CLI on the
main asks its admin socket for (letsinfer.lifecycle.routes), run where the
main's gateway drains and proves groups: on the gateway's loop, not the
control plane's thread. Each answers when the rollout has finished."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.control.ops.answers import RolloutAnswer
from letsinfer.control.ops.context import OpsContext
from letsinfer.trust.peer import Peer

T = TypeVar("T")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Upgrade(_Body):
    release: str = Field(max_length=200)
    nodes: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=256)


class Rollback(_Body):
    to: str | None = Field(None, max_length=200)
    nodes: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=256)


class Rollouts(Protocol):
    async def upgrade(self, name: str, body: Upgrade, actor: str, role: str) -> dict[str, Any]:
        """The rollout's result (or HTTPException: refused, busy, not found)."""

    async def rollback(self, name: str, body: Rollback, actor: str, role: str) -> dict[str, Any]:
        """The rollout's result (or HTTPException)."""


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


class NoRollouts:
    """Where no gateway runs beside the authority (a plane built for tests)."""

    async def upgrade(self, name: str, body: Upgrade, actor: str, role: str) -> dict[str, Any]:
        from fastapi import HTTPException

        raise HTTPException(503, "no gateway runs here to drain and prove placement groups")

    async def rollback(self, name: str, body: Rollback, actor: str, role: str) -> dict[str, Any]:
        return await self.upgrade(name, Upgrade(release="-"), actor, role)


def rollouts_router(ops: OpsContext, rollouts: Rollouts) -> APIRouter:
    router = APIRouter(tags=["models"])

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

    return router
