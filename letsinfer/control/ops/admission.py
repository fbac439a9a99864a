"""Models into the main from a controller: `model pull` (from the hub or the
main's mirror) and `model add --gguf` of a file already on the main. Each
runs the function the CLI on the main runs (letsinfer.admission), in a
worker thread with its own authority connection as the CLI has, and answers
with what it said: a controller prints those lines as the main's CLI would
(as they are said, with the download's progress, when it asks for the
stream: letsinfer.control.ops.streamed).
Nothing is uploaded: a file to add is one the main already has, under a
directory a controller may add from (letsinfer.control.ops.main_files)."""

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.admission.gguf import Refused, Where, admit_gguf
from letsinfer.admission.pull import Pull, pull_model
from letsinfer.admission.said import Transcript
from letsinfer.bundle.progress import Progress
from letsinfer.contracts.artifacts import ModelFileError
from letsinfer.control.ops.answers import AdmissionAnswer
from letsinfer.control.ops.context import OpsContext
from letsinfer.control.ops.main_files import main_file
from letsinfer.control.ops.streamed import answered
from letsinfer.home import Home
from letsinfer.hub.pull import PullRequest
from letsinfer.store import ServiceRecord, StoreError
from letsinfer.trust.peer import Peer

Name = Annotated[str, Field(min_length=1, max_length=128)]


class _Placed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    aliases: list[Name] = Field(default_factory=list, max_length=32)
    engine: Literal["xllamacpp", "llama-server"] | None = None
    no_serve: bool = False
    nodes: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=256)
    target: Literal["auto", "cpu", "cuda"] = "auto"
    gpus: int = Field(1, ge=1, le=64)

    def where(self) -> Where:
        where = Where(tuple(self.nodes), self.target, self.gpus)
        if self.no_serve and where != Where():
            raise HTTPException(
                400, "--node, --target and --gpus place a model; --no-serve does not"
            )
        return where


class PullAsk(_Placed):
    repo: str = Field(min_length=1, max_length=300)
    revision: str = Field("main", min_length=1, max_length=200)
    file: str | None = Field(None, max_length=500)
    quant: str | None = Field(None, max_length=64)
    name: Name | None = None


class AddAsk(_Placed):
    name: Name
    gguf: str = Field(min_length=1, max_length=4096, description="A file on the main")
    fallback: Name | None = None


def refused_saying(status: int, message: str, said: Transcript) -> JSONResponse:
    """The error shape, with what was said before the refusal (the CLI on
    the main printed it before its error)."""
    return JSONResponse(
        {"error": {"message": message, "code": status, "said": said.to_json()}},
        status_code=status,
    )


def admission_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["models"])

    def home() -> Home:
        if ops.home is None:
            raise HTTPException(503, "this plane has no model store to add to")
        return ops.home

    async def run(said: Transcript, work: Any) -> ServiceRecord | JSONResponse | None:
        try:
            svc: ServiceRecord | None = await asyncio.to_thread(work)
        except Refused as exc:
            return refused_saying(409, str(exc), said)
        except (StoreError, ModelFileError) as exc:  # a name refused, a file not admitted
            return refused_saying(400, str(exc), said)
        except OSError as exc:  # a file on the main this node may not read
            return refused_saying(400, f"cannot read {exc.filename}: {exc.strerror}", said)
        if svc is not None:
            await ops.on_change()  # the gateway and the agents act on it now
        return svc

    @router.post("/v1/ops/models/pull", response_model=AdmissionAnswer)
    async def model_pull(
        body: PullAsk, p: Annotated[Peer, ops.need("operator")], request: Request
    ) -> Any:
        """Resolve, download with resume, verify the published sha256, then add
        and place the model as `model add` does; answers when it is done
        (with `Accept: application/x-ndjson`, as it goes: docs/admin-api.md)."""
        if body.file and body.quant:
            raise HTTPException(400, "give --file or --quant, not both")
        ask = Pull(
            PullRequest(body.repo, body.revision, body.file, body.quant),
            body.name,
            tuple(body.aliases),
            body.engine,
            body.no_serve,
            body.where(),
        )
        where = home()

        async def work(said: Transcript, progress: Callable[[], Progress]) -> Any:
            done = await run(
                said,
                lambda: pull_model(where, ops.identity, said, progress(), ask, ops.actor(p)),
            )
            if isinstance(done, JSONResponse):
                return done
            return AdmissionAnswer(model=done.name if done else None, said=said.to_json())

        return await answered(request, work)

    @router.post("/v1/ops/models/add", response_model=AdmissionAnswer)
    async def model_add(
        body: AddAsk, p: Annotated[Peer, ops.need("operator")], request: Request
    ) -> Any:
        """A GGUF file already on the main (a path there: nothing is uploaded),
        checked, placed, proven and added (with `Accept: application/x-ndjson`,
        answered as it goes: docs/admin-api.md)."""
        where = home()
        path = main_file(where, ops.settings(), ops.identity.name, body.gguf, "model add --gguf")
        placed = body.where()

        async def work(said: Transcript, progress: Callable[[], Progress]) -> Any:
            done = await run(
                said,
                lambda: admit_gguf(
                    where,
                    ops.identity,
                    said,
                    body.name,
                    path,
                    tuple(body.aliases),
                    body.engine,
                    body.no_serve,
                    placed,
                    fallback=body.fallback,
                    actor=ops.actor(p),
                ),
            )
            if isinstance(done, JSONResponse):
                return done
            return AdmissionAnswer(model=done.name if done else None, said=said.to_json())

        return await answered(request, work)

    return router
