"""The admin socket's exposure route: the CLI on the main's machine asks the
running node to serve what ``<etc>/exposure.json`` says now (never a
controller: publishing the plane is decided on the main's own machine)."""

from fastapi import APIRouter, HTTPException, Request

from letsinfer.exposure.serving import ExposureRunner
from letsinfer.trust.peer import gated_peer


def exposure_router(runner: ExposureRunner) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/local/exposure")
    async def exposure_state() -> dict[str, object]:
        return runner.state()

    @router.post("/v1/local/exposure/apply")
    async def exposure_apply(request: Request) -> dict[str, object]:
        if gated_peer(request).identity.kind != "local":  # the admin socket only
            raise HTTPException(403, "only the CLI on the main's machine changes the exposure")
        return await runner.apply()

    return router
