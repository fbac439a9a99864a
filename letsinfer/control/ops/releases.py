"""`release add` from a controller (administrator): a signed runtime release
of a llama-server binary, made by the function the CLI on the main runs
(letsinfer.release.adding). The main runs the binary once (`--version`) to
identify it, so a controller names only a binary already on the main where
controllers may add from (its model store, its mirror, [control] add_from:
letsinfer.control.ops.main_files); any other path is refused before the main
looks for it, let alone runs it. Nothing is uploaded."""

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.audit.anchor import open_authority
from letsinfer.control.ops.answers import ReleaseAdded
from letsinfer.control.ops.context import OpsContext
from letsinfer.control.ops.main_files import main_file
from letsinfer.engines.binary import BinaryError
from letsinfer.release.adding import AddedRelease, add_runtime_release
from letsinfer.trust.peer import Peer


class ReleaseAdd(BaseModel):
    model_config = ConfigDict(extra="forbid")
    binary: str = Field(min_length=1, max_length=4096, description="A file on the main")
    target: Literal["cpu", "cuda", "rocm", "metal"] = "cpu"


def releases_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["releases"])

    @router.post("/v1/ops/releases")
    async def release_add(
        body: ReleaseAdd, p: Annotated[Peer, ops.need("administrator")]
    ) -> ReleaseAdded:
        """A llama-server binary already on the main, identified and released
        as it is now (its path and sha256), signed; once (again: nothing changes)."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no release key to sign with")
        home = ops.home
        path = main_file(
            home, ops.settings(), ops.identity.name, body.binary, "release add --llama-server", ""
        )
        actor, role = ops.actor(p), p.identity.role

        def add() -> AddedRelease:
            own = open_authority(home)  # its own connection, as the CLI on the main has
            try:
                return add_runtime_release(
                    home, own, str(path), body.target, actor=actor, role=role
                )
            finally:
                own.close()

        try:
            added = await asyncio.to_thread(add)
        except BinaryError as exc:
            raise HTTPException(
                400, f"cannot release {body.binary}: {exc}. Nothing changed."
            ) from exc
        return ReleaseAdded(
            release=added.release,
            existed=added.existed,
            binary=added.binary,
            sha256=added.sha256,
            version=added.version,
        )

    return router
