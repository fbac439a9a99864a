"""`model update` from a controller: the new weights downloaded and verified
on the main by the function the CLI on the main runs (letsinfer.admission.update,
in a worker thread), then rolled out on the main's gateway loop as the admin
socket rolls them out (letsinfer.lifecycle.weight_routes). Answers when the
rollout has finished, with what the download said (or streams it as it
goes, when asked: letsinfer.control.ops.streamed)."""

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.admission.gguf import Refused
from letsinfer.admission.said import Transcript
from letsinfer.admission.update import NoSuchModel, fetch_update
from letsinfer.bundle.progress import Progress
from letsinfer.control.ops.admission import refused_saying
from letsinfer.control.ops.answers import RolloutAnswer, UpdateAnswer
from letsinfer.control.ops.context import OpsContext
from letsinfer.control.ops.rollouts import GateBody, Rollouts, Update
from letsinfer.control.ops.streamed import answered
from letsinfer.trust.peer import Peer


class UpdateAsk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Branch, tag or commit (None: the revision it was pulled at, resolved again).
    revision: str | None = Field(None, min_length=1, max_length=200)
    nodes: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=256)
    gate: GateBody | None = None  # None: the model's own gate, if it has one
    canary: float | None = Field(None, gt=0, lt=100)


def updates_router(ops: OpsContext, rollouts: Rollouts) -> APIRouter:
    router = APIRouter(tags=["models"])

    @router.post("/v1/ops/models/{name:path}/update-from-origin", response_model=UpdateAnswer)
    async def model_update(
        name: str, body: UpdateAsk, p: Annotated[Peer, ops.need("operator")], request: Request
    ) -> Any:
        """Resolve the model's repository again at the revision, download and
        verify the new weights as `model pull` does, then replace its groups
        one at a time (or start one canary group) as `model upgrade` does
        (with `Accept: application/x-ndjson`, answered as it goes:
        docs/admin-api.md)."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no model store to update into")
        home, actor = ops.home, ops.actor(p)

        async def work(said: Transcript, progress: Callable[[], Progress]) -> Any:
            try:
                fetched = await asyncio.to_thread(
                    fetch_update, home, said, progress(), name, body.revision, actor
                )
            except Refused as exc:
                status = 404 if isinstance(exc, NoSuchModel) else 409
                return refused_saying(status, str(exc), said)
            shown: dict[str, Any] = {
                "said": said.to_json(),
                "model": fetched.model,
                "repo": fetched.repo,
                "commit": fetched.commit,
                "sha256": fetched.sha256,
                "rollout": None,
            }
            if fetched.sha256 is None:
                return UpdateAnswer.model_validate(shown)
            new = Update(
                sha256=fetched.sha256,
                size=fetched.size,
                origin=fetched.origin,
                nodes=body.nodes,
                gate=body.gate,
                canary=body.canary,
            )
            try:
                done = await rollouts.update_weights(
                    fetched.model, new, home.model_store, actor, p.identity.role
                )
            except HTTPException as exc:  # refused or busy: after what the download said
                return refused_saying(exc.status_code, str(exc.detail), said)
            shown["rollout"] = RolloutAnswer.model_validate(done)
            return UpdateAnswer.model_validate(shown)

        return await answered(request, work)

    return router
