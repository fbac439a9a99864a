"""`model update` from a controller: the new weights downloaded and verified
on the main by the function the CLI on the main runs (letsinfer.admission.update,
in a worker thread), then rolled out on the main's gateway loop as the admin
socket rolls them out (letsinfer.lifecycle.weight_routes). Answers when the
rollout has finished, with what the download said."""

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.admission.gguf import Refused
from letsinfer.admission.said import SaidProgress, Transcript
from letsinfer.admission.update import NoSuchModel, fetch_update
from letsinfer.control.ops.admission import refused_saying
from letsinfer.control.ops.answers import RolloutAnswer, UpdateAnswer
from letsinfer.control.ops.context import OpsContext
from letsinfer.control.ops.rollouts import GateBody, Rollouts, Update
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
        name: str, body: UpdateAsk, p: Annotated[Peer, ops.need("operator")]
    ) -> Any:
        """Resolve the model's repository again at the revision, download and
        verify the new weights as `model pull` does, then replace its groups
        one at a time (or start one canary group) as `model upgrade` does."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no model store to update into")
        home, said, actor = ops.home, Transcript(), ops.actor(p)
        try:
            fetched = await asyncio.to_thread(
                fetch_update, home, said, SaidProgress(said), name, body.revision, actor
            )
        except Refused as exc:
            return refused_saying(404 if isinstance(exc, NoSuchModel) else 409, str(exc), said)
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

    return router
