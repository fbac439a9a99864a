"""Serve mirror artifacts by digest, read-only, with HTTP Range.

Only what the catalog lists is served, under its digest; an interrupted fetch
resumes with ``Range: bytes=N-``. The router holds no authentication of its
own: it is meant to be mounted on the mutual-TLS control plane, whose
listener already refuses a peer without a verified certificate.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

from letsinfer.mirror.catalog import CatalogError, read_catalog
from letsinfer.mirror.layout import DIGEST, MirrorLayout

ARTIFACT_ROUTE = "/mirror/sha256/{digest}"


def artifact_router(
    layout: MirrorLayout, also: Callable[[str], Path | None] | None = None
) -> APIRouter:
    """``also`` looks a digest up in another content-addressed store first (the
    main's model store), so nodes fetch every artifact the same way."""
    router = APIRouter()

    def respond(path: Path, digest: str) -> FileResponse:
        return FileResponse(
            path,
            media_type="application/octet-stream",
            # The digest names the bytes exactly: a strong validator for If-Range.
            headers={"ETag": f'"{digest}"', "Cache-Control": "immutable"},
        )

    @router.api_route(ARTIFACT_ROUTE, methods=["GET", "HEAD"])
    async def artifact(digest: str) -> FileResponse:
        if not DIGEST.fullmatch(digest):
            raise HTTPException(404, "not a sha256 digest")
        other = also(digest) if also is not None else None
        if other is not None:
            return respond(other, digest)
        try:
            catalog = read_catalog(layout)
        except CatalogError as exc:
            raise HTTPException(503, "the mirror catalog cannot be read") from exc
        path = layout.blob(digest)
        if digest not in catalog.artifacts or not path.is_file():
            raise HTTPException(404, f"no artifact sha256:{digest} in this mirror")
        return respond(path, digest)

    return router
