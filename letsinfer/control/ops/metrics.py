"""The main's metrics from a controller (`letsinfer top`): the text its
metrics endpoint serves, read over the main's loopback by the function `top`
on the main reads it with (letsinfer.telemetry.top), so a workstation shows
the same figures. Read only when asked; nothing is kept."""

import asyncio
from typing import Annotated

from fastapi import APIRouter, HTTPException

from letsinfer.control.ops.answers import MetricsAnswer
from letsinfer.control.ops.context import OpsContext
from letsinfer.telemetry.top import MetricsUnread, metrics_text
from letsinfer.trust.peer import Peer


def metrics_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["state"])

    @router.get("/v1/ops/metrics")
    async def metrics(p: Annotated[Peer, ops.need("viewer")]) -> MetricsAnswer:
        """The main's metrics in Prometheus's text format, as it serves them now."""
        try:
            text = await asyncio.to_thread(metrics_text, ops.settings().gateway)
        except MetricsUnread as exc:  # off, or its listener does not answer (the main's state)
            raise HTTPException(409, str(exc)) from exc
        return MetricsAnswer(text=text)

    return router
