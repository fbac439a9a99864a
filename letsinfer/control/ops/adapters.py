"""LoRA adapters from a controller: `model adapter list`, `add` (of a file
already on the main, under a directory a controller may add from:
letsinfer.control.ops.main_files) and `remove`, each followed, as on the
main, by its base model's groups loading the adapters again one at a time
on the gateway's loop."""

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.audit.anchor import open_authority
from letsinfer.authority.adapters import (
    AdapterRefused,
    adapter_rows,
    add_adapter,
    remove_adapter,
)
from letsinfer.control.ops.answers import AdapterChanged, AdapterListed
from letsinfer.control.ops.context import OpsContext
from letsinfer.control.ops.main_files import main_file
from letsinfer.control.ops.rollouts import Rollouts
from letsinfer.home import Home
from letsinfer.store import StoreError
from letsinfer.trust.peer import Peer

Name = Annotated[str, Field(min_length=1, max_length=128)]


class AdapterAdd(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name
    gguf: str = Field(min_length=1, max_length=4096, description="A file on the main")


def adapters_router(ops: OpsContext, rollouts: Rollouts) -> APIRouter:
    router = APIRouter(tags=["models"])

    def home() -> Home:
        if ops.home is None:
            raise HTTPException(503, "this plane has no model store")
        return ops.home

    async def reloaded(base: str, p: Peer) -> dict[str, Any] | None:
        done = await rollouts.reload(base, ops.actor(p), p.identity.role)
        if done is None:  # no gateway here: each group loads them when it starts
            ops.store.unpin_adapters([g.id for g in ops.store.list_placement_groups(service=base)])
        return done

    @router.get("/v1/ops/adapters")
    async def adapter_list(
        p: Annotated[Peer, ops.need("viewer")],
        model: Annotated[str | None, Query(max_length=200)] = None,
    ) -> list[AdapterListed]:
        """LoRA adapters (of one model only, when given)."""
        try:
            return [AdapterListed.model_validate(r) for r in adapter_rows(ops.store, model)]
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc

    @router.post("/v1/ops/models/{name:path}/adapters")
    async def adapter_add(
        name: str, body: AdapterAdd, p: Annotated[Peer, ops.need("operator")]
    ) -> AdapterChanged:
        """A LoRA GGUF already on the main, checked against the model and
        served as ``name``; the model's groups then load it one at a time."""
        where = home()
        path = main_file(
            where, ops.settings(), ops.identity.name, body.gguf, "model adapter add --gguf"
        )
        actor, role = ops.actor(p), p.identity.role

        def add() -> Any:
            own = open_authority(where)  # its own connection, as the CLI on the main has
            try:
                return add_adapter(
                    own, where.model_store, name, body.name, path, actor=actor, role=role
                )
            finally:
                own.close()

        try:
            made = await asyncio.to_thread(add)
        except AdapterRefused as exc:
            raise HTTPException(400, str(exc)) from exc
        except StoreError as exc:
            raise HTTPException(404 if str(exc).startswith("no model") else 409, str(exc)) from exc
        except OSError as exc:
            raise HTTPException(400, f"cannot read {exc.filename}: {exc.strerror}") from exc
        return AdapterChanged(
            adapter=made.name,
            model=made.service,
            sha256=made.artifact_digest,
            narrowed=[],
            reload=await reloaded(made.service, p),
        )

    @router.post("/v1/ops/adapters/{name:path}/remove")
    async def adapter_remove(name: str, p: Annotated[Peer, ops.need("operator")]) -> AdapterChanged:
        """Requests naming the adapter get 404 at once; its model's groups then
        restart one at a time without it."""
        where = home()
        try:
            gone, narrowed = remove_adapter(
                ops.store, where.model_store, name, actor=ops.actor(p), role=p.identity.role
            )
        except StoreError as exc:
            status = 404 if store_missing(name, ops) else 409
            raise HTTPException(status, str(exc)) from exc
        return AdapterChanged(
            adapter=gone.name,
            model=gone.service,
            sha256=gone.artifact_digest,
            narrowed=narrowed,
            reload=await reloaded(gone.service, p),
        )

    return router


def store_missing(name: str, ops: OpsContext) -> bool:
    """Whether NAME names no adapter (404), not one refused for now (409)."""
    return ops.store.get_adapter(name) is None
