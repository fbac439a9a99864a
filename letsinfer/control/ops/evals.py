"""Eval runs from a controller: `eval runs` and `eval show`, read as the CLI
on the main reads them (letsinfer.evals.shown). Running a suite stays on the
main: it sends requests through the gateway under a key of its own."""

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from letsinfer.control.ops.answers import EvalRunDetail, EvalRunListed
from letsinfer.control.ops.context import OpsContext
from letsinfer.evals.shown import no_run, run_row, run_shown
from letsinfer.trust.peer import Peer


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

    @router.get("/v1/ops/evals/{run:path}")
    async def eval_show(run: str, p: Annotated[Peer, ops.need("viewer")]) -> EvalRunDetail:
        """One run (its id, or the start of it) and each of its cases."""
        found = ops.store.get_eval_run(run)
        if found is None:
            raise HTTPException(404, no_run(run))
        return EvalRunDetail.model_validate(run_shown(*found))

    return router
