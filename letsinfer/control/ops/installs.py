"""`model install` from a controller: planned and made by the function the
CLI on the main runs (letsinfer.admission.install, in a worker thread with
its own authority connection, as the CLI has), then the groups it replaces
rolled out on the main's gateway loop as the admin socket rolls them out.
Nothing asks a controller: its request carries the answers (`yes`,
`replace_existing`); without them the main says what it would do and
refuses, changing nothing. Answers with what the CLI on the main says."""

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.admission.gguf import Refused
from letsinfer.admission.install import InstallAsk, Installed, install_model
from letsinfer.admission.said import Transcript
from letsinfer.audit.anchor import open_authority
from letsinfer.control.ops.admission import refused_saying
from letsinfer.control.ops.answers import InstallAnswer
from letsinfer.control.ops.context import OpsContext
from letsinfer.control.ops.rollouts import Replace, Rollouts
from letsinfer.store import StoreError
from letsinfer.trust.peer import Peer

NodeName = Annotated[str, Field(min_length=1, max_length=200)]


class InstallBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[NodeName] = Field(default_factory=list, max_length=256)
    target: Literal["auto", "cpu", "cuda"] = "auto"
    gpus: int = Field(1, ge=1, le=64)
    gpu_uuids: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list, max_length=64
    )
    engine: Literal["xllamacpp", "llama-server"] | None = None
    # The answers the CLI on the main would ask for: replace the groups this
    # model already has on those nodes; with no nodes, every active node.
    replace_existing: bool = False
    parallel: bool = False
    yes: bool = False


def installs_router(ops: OpsContext, rollouts: Rollouts) -> APIRouter:
    router = APIRouter(tags=["models"])

    @router.post("/v1/ops/models/{name:path}/install", response_model=InstallAnswer)
    async def model_install(
        name: str, body: InstallBody, p: Annotated[Peer, ops.need("operator")]
    ) -> Any:
        """Place the model on nodes (one group per node, or one parallel group),
        replacing its groups there only with `replace_existing`: each new group
        proven before the one it replaces drains. Answers when it is done."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no model store to install from")
        home, said, actor, role = ops.home, Transcript(), ops.actor(p), p.identity.role
        ask = InstallAsk(
            name,
            tuple(body.nodes),
            body.target,
            body.gpus,
            tuple(body.gpu_uuids),
            body.engine,
            body.replace_existing,
            body.parallel,
            body.yes,
        )

        def install() -> Installed:
            own = open_authority(home)  # its own connection, as the CLI on the main has
            try:
                return install_model(
                    home, own, ops.identity.node_id, said, ask, None, actor=actor, role=role
                )
            finally:
                own.close()

        try:
            done = await asyncio.to_thread(install)
        except Refused as exc:
            return refused_saying(409, str(exc), said)
        except StoreError as exc:  # no such model, or an external one
            return refused_saying(404 if str(exc).startswith("no model") else 409, str(exc), said)
        if done.created:
            await ops.on_change()  # the gateway and the agents act on them now
        rollout = None
        if done.replacing is not None:
            replacing = Replace.model_validate({"replacements": done.replacements()})
            try:
                rollout = await rollouts.replace(done.model, replacing, actor, role)
            except HTTPException as exc:  # refused or busy: after what the plan said
                return refused_saying(exc.status_code, str(exc.detail), said)
        return InstallAnswer.model_validate(
            {
                "said": said.to_json(),
                "model": done.model,
                "created": done.created,
                "rollout": rollout,
            }
        )

    return router
