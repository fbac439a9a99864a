"""`letsinfer doctor --cluster` from a controller: the design's invariants
across the cluster, checked on the main from its authority, as the main's own
CLI checks them. A report with failures is an answer (200, ``ok`` false): the
CLI exits 1 on it, as on the main."""

from typing import Annotated

from fastapi import APIRouter, HTTPException

from letsinfer.control.ops.answers import DoctorReport
from letsinfer.control.ops.context import OpsContext
from letsinfer.doctor.cluster import check_main
from letsinfer.doctor.findings import report
from letsinfer.trust.peer import Peer


def doctor_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["doctor"])

    @router.get("/v1/ops/doctor/cluster")
    async def doctor_cluster(p: Annotated[Peer, ops.need("viewer")]) -> DoctorReport:
        if ops.home is None:
            raise HTTPException(503, "this plane has no home to check the cluster from")
        stale_after_s = ops.settings().control.node_stale_after_s
        findings = check_main(ops.home, ops.identity, ops.store, stale_after_s)
        return DoctorReport.model_validate(report(ops.identity.name, findings))

    return router
