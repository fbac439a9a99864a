"""Eval runs from a controller: `eval runs` and `eval show`, read as the CLI
on the main reads them (letsinfer.evals.shown), and `eval run`: the main
runs a built-in suite against its own gateway under its own eval key, by
the function the CLI on the main runs (letsinfer.evals.running), and answers
with what it said. A controller names no suite file: the main opens no path
a controller names."""

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.admission.said import Transcript
from letsinfer.control.ops.admission import refused_saying
from letsinfer.control.ops.answers import EvalRunAnswer, EvalRunDetail, EvalRunListed
from letsinfer.control.ops.context import OpsContext
from letsinfer.evals.runner import EvalError
from letsinfer.evals.running import EvalAskRefused, run_eval
from letsinfer.evals.shown import no_run, run_row, run_shown
from letsinfer.evals.suite import builtin_names, load
from letsinfer.trust.peer import Peer


class EvalAsk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=200)
    suite: str = Field(min_length=1, max_length=200, description="A built-in suite's name")
    group: str | None = Field(None, min_length=1, max_length=64)
    # As `--json`: no progress lines, the run alone.
    as_json: bool = False


def evals_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["evals"])

    @router.get("/v1/ops/evals")
    async def eval_runs(
        p: Annotated[Peer, ops.need("viewer")],
        model: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 50,
    ) -> list[EvalRunListed]:
        """The eval runs kept, the latest first."""
        return [
            EvalRunListed.model_validate(run_row(r)) for r in ops.store.list_eval_runs(model, limit)
        ]

    @router.post("/v1/ops/evals", response_model=EvalRunAnswer)
    async def eval_run(body: EvalAsk, p: Annotated[Peer, ops.need("operator")]) -> Any:
        """Run a built-in suite against the model through the main's gateway,
        score it, keep the run (audited with its score); answers when it is done."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no gateway to run an eval through")
        if body.suite not in builtin_names():
            raise HTTPException(
                400,
                f"{body.suite!r}: from a controller, an eval's suite is a built-in one "
                f"({', '.join(builtin_names())}). Nothing was run.",
            )
        home, said = ops.home, Transcript()
        suite = load(body.suite)
        try:
            done = await asyncio.to_thread(
                run_eval,
                home,
                said,
                suite,
                body.model,
                body.group,
                as_json=body.as_json,
                actor=ops.actor(p),
                role=p.identity.role,
            )
        except EvalAskRefused as exc:  # the CLI names the parameter, as on the main
            return JSONResponse(
                {"error": {"message": str(exc), "code": 404, "param": exc.param}},
                status_code=404,
            )
        except EvalError as exc:  # after what the run said (the gateway's fault, not this plane's)
            return refused_saying(409, str(exc), said)
        return EvalRunAnswer.model_validate({"said": said.to_json(), "run": done})

    @router.get("/v1/ops/evals/{run:path}")
    async def eval_show(run: str, p: Annotated[Peer, ops.need("viewer")]) -> EvalRunDetail:
        """One run (its id, or the start of it) and each of its cases."""
        found = ops.store.get_eval_run(run)
        if found is None:
            raise HTTPException(404, no_run(run))
        return EvalRunDetail.model_validate(run_shown(*found))

    return router
