"""The main's mirror from a controller: `mirror unused`, the artifacts that
nothing in the authority refers to (the same reading the CLI on the main
makes, letsinfer.mirror.references), and `mirror remove` of one of them."""

from typing import Annotated

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.control.ops.answers import ArtifactShown
from letsinfer.control.ops.context import OpsContext
from letsinfer.mirror.catalog import CatalogError, read_catalog
from letsinfer.mirror.errors import MirrorError
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.mirror.references import authority_references, unused
from letsinfer.mirror.removal import remove_artifact
from letsinfer.trust.peer import Peer


class MirrorRemove(BaseModel):
    model_config = ConfigDict(extra="forbid")
    digest: str = Field(min_length=1, max_length=80, description="sha256, or a unique prefix")


def mirror_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["mirror"])

    @router.get("/v1/ops/mirror/unused")
    async def mirror_unused(p: Annotated[Peer, ops.need("viewer")]) -> list[ArtifactShown]:
        home = ops.home
        if home is None:
            raise HTTPException(503, "this plane has no mirror")
        try:
            # Both sources must be readable: a guess here would lead to a wrong removal.
            catalog = read_catalog(MirrorLayout.for_home(home))
            references = authority_references(home.database)
        except (CatalogError, MirrorError) as exc:
            raise HTTPException(409, str(exc)) from exc
        return [ArtifactShown.model_validate(a.model_dump()) for a in unused(catalog, references)]

    @router.post("/v1/ops/mirror/remove")
    async def mirror_remove(
        body: MirrorRemove, p: Annotated[Peer, ops.need("administrator")]
    ) -> ArtifactShown:
        """One artifact goes; refused while anything in the authority refers to it."""
        home = ops.home
        if home is None:
            raise HTTPException(503, "this plane has no mirror")
        try:
            references = authority_references(home.database)
            removed = remove_artifact(MirrorLayout.for_home(home), body.digest, references)
        except (CatalogError, MirrorError) as exc:
            raise HTTPException(409, str(exc)) from exc
        ops.store.append_audit(
            ops.actor(p),
            "mirror.remove",
            "ok",
            role=p.identity.role,
            target=f"sha256:{removed.digest}",
            detail=", ".join(removed.names),
        )
        return ArtifactShown.model_validate(removed.model_dump())

    return router
