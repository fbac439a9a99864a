"""A model's gate from a controller: `model gate` shown (viewer), set or
cleared (operator), by the function the CLI on the main runs
(letsinfer.evals.gate_setting). A controller names a built-in suite only: a
suite file is read by the main's service, and the main opens no path a
controller names."""

from typing import Annotated

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.control.ops.answers import GateAnswer
from letsinfer.control.ops.context import OpsContext
from letsinfer.evals.gate import GateSpec
from letsinfer.evals.gate_setting import GateRefused, change_gate
from letsinfer.evals.suite import SuiteError, builtin_names
from letsinfer.trust.peer import Peer


class GateChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    suite: str = Field(min_length=1, max_length=200, description="A built-in suite's name")
    min_score: float = Field(ge=0.0, le=1.0)


def gates_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["models"])

    def changed(name: str, spec: GateSpec | None, clear: bool, p: Peer) -> GateAnswer:
        try:
            shown = change_gate(ops.store, name, spec, clear, ops.actor(p), role=p.identity.role)
        except GateRefused as exc:
            raise HTTPException(404 if exc.missing else 409, str(exc)) from exc
        return GateAnswer.model_validate(shown)

    @router.get("/v1/ops/models/{name:path}/gate")
    async def model_gate(name: str, p: Annotated[Peer, ops.need("viewer")]) -> GateAnswer:
        """The suite and score the model's updates and upgrades must reach."""
        return changed(name, None, False, p)

    @router.post("/v1/ops/models/{name:path}/gate")
    async def model_gate_set(
        name: str, body: GateChange, p: Annotated[Peer, ops.need("operator")]
    ) -> GateAnswer:
        """Set the model's gate to a built-in suite and a minimum score."""
        if body.suite not in builtin_names():
            raise HTTPException(
                400,
                f"{body.suite!r}: from a controller, a gate's suite is a built-in one "
                f"({', '.join(builtin_names())}). Nothing changed.",
            )
        spec = GateSpec(body.suite, body.min_score)
        try:
            spec.load()
        except SuiteError as exc:
            raise HTTPException(400, f"{exc}. Nothing changed.") from exc
        return changed(name, spec, False, p)

    @router.post("/v1/ops/models/{name:path}/gate/clear")
    async def model_gate_clear(name: str, p: Annotated[Peer, ops.need("operator")]) -> GateAnswer:
        """Remove the model's gate (none there: nothing changes)."""
        return changed(name, None, True, p)

    return router
