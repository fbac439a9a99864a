"""`exposure status` from a controller: the report the CLI on the main prints
(letsinfer.exposure.report), with the running node's TLS port read on its
gateway's loop. Publishing and closing stay on the main's own machine
(letsinfer.exposure.route)."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException

from letsinfer.control.ops.answers import ExposureShown
from letsinfer.control.ops.context import OpsContext
from letsinfer.control.ops.listing import SceneFacts
from letsinfer.exposure.report import exposure_report
from letsinfer.exposure.settings import ExposureSettingsError
from letsinfer.trust.peer import Peer


def exposure_router(ops: OpsContext, facts: SceneFacts | None) -> APIRouter:
    router = APIRouter(tags=["state"])

    @router.get("/v1/ops/exposure")
    async def exposure_status(p: Annotated[Peer, ops.need("viewer")]) -> ExposureShown:
        """What is published beyond the LAN, to whom, the certificate and
        whether the running node serves it (node: null, no node runs)."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no home to read the exposure from")
        node: dict[str, Any] | None = None
        if facts is not None:
            _, _, node = await facts()
        try:
            report = exposure_report(ops.home, ops.identity, node)
        except ExposureSettingsError as exc:
            raise HTTPException(409, str(exc)) from exc
        return ExposureShown.model_validate(report)

    return router
