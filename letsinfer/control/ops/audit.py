"""The audit chain: list and verify it, and hear of an operation a controller's CLI
refused before sending (its role lacks it): audited as denied here, on the
main, under the controller's identity."""

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.audit.anchor import HeadAnchor
from letsinfer.audit.listing import audit_rows
from letsinfer.audit.verification import verify_audit
from letsinfer.control.ops.answers import AuditRow, AuditVerified, DenialRecorded
from letsinfer.control.ops.context import OpsContext
from letsinfer.trust.peer import Peer


class RefusedCommand(BaseModel):
    """A command the CLI refused to send: what it was and the role it needs
    (``main``: it runs only on the main's own machine, as `node add --ssh`).
    No operation body: nothing of what was asked travels."""

    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1, max_length=100, pattern=r"^[a-z][a-z -]*$")
    needs: Literal["viewer", "operator", "administrator", "main"]


def audit_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["audit"])
    store = ops.store

    @router.get("/v1/ops/audit")
    async def audit_list(
        p: Annotated[Peer, ops.need("viewer")],
        limit: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,  # (SQLite's integers)
    ) -> list[AuditRow]:
        """The main's chain, oldest first; ``limit``: only the newest N records."""
        return [AuditRow.model_validate(r) for r in audit_rows(store, limit)]

    @router.get("/v1/ops/audit/verify")
    async def audit_verify(p: Annotated[Peer, ops.need("viewer")]) -> AuditVerified:
        if ops.home is None:
            raise HTTPException(503, "this plane has no signed audit head")
        return AuditVerified.model_validate(verify_audit(store, HeadAnchor.for_home(ops.home)))

    @router.post("/v1/ops/denied")
    async def refused_by_cli(
        body: RefusedCommand, p: Annotated[Peer, ops.need("viewer")]
    ) -> DenialRecorded:
        store.append_audit(
            ops.actor(p),
            f"cli:{body.command}",
            "denied",
            role=p.identity.role,
            detail=(
                "runs only on the main itself" if body.needs == "main" else f"needs {body.needs}"
            )
            + "; refused by the controller's CLI before sending",
        )
        return DenialRecorded(recorded=True)

    return router
