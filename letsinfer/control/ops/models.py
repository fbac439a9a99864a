"""A model's lifecycle and policy: stop, start, resume, scaling, fallback."""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.admission.plan import planned
from letsinfer.authority import lifecycle
from letsinfer.authority.external import fallback_notes, set_fallback
from letsinfer.authority.links import ResumeRefused, resume_model
from letsinfer.authority.views import adapter_named
from letsinfer.capacity.setting import set_policy as set_scaling_policy
from letsinfer.control.ops.answers import (
    DesiredAnswer,
    FallbackAnswer,
    PlanAnswer,
    ResumeAnswer,
    ScaleAnswer,
    StartAnswer,
)
from letsinfer.control.ops.context import OpsContext
from letsinfer.storage import refetch
from letsinfer.store import StoreError
from letsinfer.trust.peer import Peer


class ScaleChange(BaseModel):
    """A model's scaling policy; a field not sent stays as it is."""

    model_config = ConfigDict(extra="forbid")
    min_groups: int | None = Field(None, ge=0, le=64)
    max_groups: int | None = Field(None, ge=1, le=64)
    idle_s: float | None = Field(None, ge=0, le=30 * 86400)
    min_resident_s: float | None = Field(None, ge=0, le=30 * 86400)
    target_inflight: float | None = Field(None, gt=0, le=10_000)
    scale_down_s: float | None = Field(None, ge=0, le=30 * 86400)

    def change(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump(exclude_unset=True).items() if v is not None}


class FallbackChange(BaseModel):
    """The model that answers when another cannot; null: none."""

    model_config = ConfigDict(extra="forbid")
    fallback: str | None = Field(max_length=200)


def models_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["models"])
    store = ops.store

    def refuse_adapter(name: str, verb: str) -> None:
        why = adapter_named(store, name, verb)
        if why is not None:
            raise HTTPException(404, why)

    async def set_desired(name: str, desired: str, p: Peer) -> dict[str, Any]:
        refuse_adapter(name, "start" if desired == "running" else "stop")
        try:
            done = lifecycle.set_model_desired(
                store, name, desired, actor=ops.actor(p), role=p.identity.role
            )
        except lifecycle.NotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        except lifecycle.Refused as exc:
            raise HTTPException(409, f"{exc}. Nothing changed.") from exc
        await ops.on_change()
        return done.to_json()

    @router.post("/v1/ops/models/{name:path}/stop")
    async def model_stop(name: str, p: Annotated[Peer, ops.need("operator")]) -> DesiredAnswer:
        return DesiredAnswer.model_validate(await set_desired(name, "stopped", p))

    @router.post("/v1/ops/models/{name:path}/start")
    async def model_start(name: str, p: Annotated[Peer, ops.need("operator")]) -> StartAnswer:
        answer = await set_desired(name, "running", p)
        return StartAnswer.model_validate(
            {
                **answer,
                "downloads": refetch.downloads(store, answer["model"]),
                "start_timeout_s": ops.settings().lifecycle.start_timeout_s,
            }
        )

    @router.post("/v1/ops/models/{name:path}/fallback")
    async def model_fallback(
        name: str, body: FallbackChange, p: Annotated[Peer, ops.need("administrator")]
    ) -> FallbackAnswer:
        # An administrator's: a fallback may send requests to a provider outside.
        try:
            svc = set_fallback(store, name, body.fallback, actor=ops.actor(p), role=p.identity.role)
        except StoreError as exc:
            status = 404 if str(exc).startswith("no model") else 400
            raise HTTPException(status, f"{exc}. Nothing changed.") from exc
        await ops.on_change()  # the gateway uses it before this answers
        return FallbackAnswer(
            model=svc.name, fallback=svc.fallback, notes=fallback_notes(store, name)
        )

    @router.get("/v1/ops/models/{name:path}/scale")
    async def model_scale_shown(name: str, p: Annotated[Peer, ops.need("viewer")]) -> ScaleAnswer:
        svc = store.resolve_service(name)
        if svc is None:
            raise HTTPException(404, f"no model {name!r} (see `letsinfer model list`)")
        policy = store.scaling_policy(svc.name)
        return ScaleAnswer(model=svc.name, policy=policy.to_json(), summary=policy.describe())

    @router.post("/v1/ops/models/{name:path}/scale")
    async def model_scale(
        name: str, body: ScaleChange, p: Annotated[Peer, ops.need("operator")]
    ) -> ScaleAnswer:
        try:
            canonical, policy = set_scaling_policy(
                store, name, body.change(), actor=ops.actor(p), role=p.identity.role
            )
        except StoreError as exc:
            status = 404 if str(exc).startswith("no model") else 400
            raise HTTPException(status, f"{exc}. Nothing changed.") from exc
        await ops.on_change()  # the gateway loads and unloads by it before this answers
        return ScaleAnswer(model=canonical, policy=policy.to_json(), summary=policy.describe())

    @router.get("/v1/ops/models/{name:path}/plan")
    async def model_plan(
        name: str,
        p: Annotated[Peer, ops.need("viewer")],
        target: Literal["auto", "cpu", "cuda"] = "auto",
        gpus: Annotated[int, Query(ge=1, le=64)] = 1,
        engine: Literal["xllamacpp", "llama-server"] | None = None,
    ) -> PlanAnswer:
        """For every active node: whether the model fits, where, with which
        release, and why a node is skipped; changes nothing."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no model store to plan from")
        try:
            shown = planned(
                store,
                ops.home.model_store,
                ops.settings(),
                ops.identity.node_id,
                name,
                target,
                gpus,
                engine,
            )
        except StoreError as exc:
            raise HTTPException(404 if str(exc).startswith("no model") else 409, str(exc)) from exc
        return PlanAnswer.model_validate(shown)

    @router.post("/v1/ops/models/{name:path}/resume")
    async def model_resume(name: str, p: Annotated[Peer, ops.need("operator")]) -> ResumeAnswer:
        refuse_adapter(name, "resume")
        try:
            done = resume_model(store, name, actor=ops.actor(p), role=p.identity.role)
        except ResumeRefused as exc:
            status = 404 if str(exc).startswith("no model") else 409
            raise HTTPException(status, f"{exc}. Nothing changed.") from exc
        await ops.on_change()
        return ResumeAnswer.model_validate(done.to_json())

    return router
