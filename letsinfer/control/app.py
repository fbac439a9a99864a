"""Control-plane routes. A fixed set of typed operations; nothing runs commands.

Open paths (no client certificate yet): completing an enrollment, joining
with a join code (a nonce, then a proof of the code's secret) and pairing a
controller, each authenticated by its one-time secret, and the main's clock
(``/v1/time``, which ``letsinfer doctor`` on a child compares with). Everything else needs a
verified cluster certificate: nodes use ``/v1/agent/*``, controllers
``/v1/ops/*`` within their role.
"""

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fastapi import Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from letsinfer.audit.denials import DenialLog
from letsinfer.authority import adoption, controllers, enrollment, joining, lifecycle
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.control.facts_route import FactsRoute
from letsinfer.control.ops import actor_of, nothing_to_apply, ops_router
from letsinfer.control.ops.context import ApplyExposure
from letsinfer.control.ops.listing import SceneFacts
from letsinfer.control.ops.nodes import OnRemoved
from letsinfer.control.ops.roles import role_check
from letsinfer.control.ops.rollouts import NoRollouts, Rollouts
from letsinfer.control.typed_app import typed_app
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.mirror.serving import artifact_router
from letsinfer.store import AuthorityStore
from letsinfer.trust import pki
from letsinfer.trust.material import ClusterCA
from letsinfer.trust.peer import NODE_REMOVED, Peer, PeerGate, Refusal, Scope, gated_peer

OPEN_PATHS = (
    "/v1/enroll/complete",
    "/v1/join/challenge",
    "/v1/join",
    "/v1/pair/ca",
    "/v1/pair/controller",
    "/v1/time",
)


class ReportIntake(Protocol):
    """Where nodes' signed facts go (letsinfer.authority.reports.ReportDesk)."""

    def admit(self) -> int | None:
        """None: take the next report now; else shed it: the seconds of
        ``Retry-After`` to answer 503 with."""

    def heard(self, node_id: str) -> None:
        """A shed report's node: alive, nothing taken."""

    async def report(self, peer: Peer, cert_der: bytes, envelope: dict[str, Any]) -> dict[str, Any]:
        """Desired state for the node; raises FactError (refused) or
        NotRecorded (not written: 503)."""


@dataclass
class ControlContext:
    store: AuthorityStore
    ca: ClusterCA
    identity: NodeIdentity
    gateway_url: str
    heartbeat_interval_s: float
    reports: ReportIntake
    model_store: Path
    mirror: MirrorLayout
    release_key: str  # the cluster's release-signing public key, for new nodes
    denials: DenialLog  # refusals, counted: never a database write per request
    # After a controller's change: the node applies it at once (key cache, routing).
    on_change: Callable[[], Awaitable[None]] = nothing_to_apply
    # The main's home (request records, signed audit head) and its rollouts,
    # run on the gateway's loop: without them those operations answer 503.
    home: Home | None = None
    rollouts: Rollouts | None = None
    scene: SceneFacts | None = None  # what only the gateway knows, for the displays
    # After a controller removed a node: the node stops routing to it, tells it.
    on_removed: OnRemoved | None = None
    # After a controller's `exposure enable/disable`: the node serves it now.
    apply_exposure: ApplyExposure | None = None


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnrollComplete(_Body):
    enrollment_id: str
    token: str
    csr: str
    agent_address: str | None = None


class Join(_Body):
    code_id: str = Field(max_length=16)
    nonce: str = Field(max_length=128)
    proof: str = Field(max_length=256)
    csr: str = Field(max_length=4096)
    node_id: str = Field(max_length=64)
    name: str = Field(max_length=63)
    agent_address: str = Field(max_length=300)


class PairController(_Body):
    code: str
    csr: str


class Pause(_Body):
    paused: bool


class Renew(_Body):
    csr: str


def create_control_app(ctx: ControlContext) -> PeerGate:
    store = ctx.store
    app = typed_app("letsinfer control plane")

    def actor(p: Peer) -> str:
        return actor_of(store, p)

    # -- open: one-time secrets --------------------------------------------
    def refusals(request: Request, action: str) -> Callable[[str], None]:
        """Refusals on an open path, counted by the address they came from."""
        who = f"anonymous:{request.client.host if request.client else '?'}"
        return lambda reason: ctx.denials.note(who, action, reason)

    @app.post("/v1/enroll/complete")
    async def enroll_complete(body: EnrollComplete, request: Request) -> dict[str, Any]:
        try:
            rec, cert = enrollment.complete(
                store,
                ctx.ca,
                body.enrollment_id,
                body.token,
                body.csr,
                body.agent_address,
                refusals(request, "node.enroll.complete"),
            )
        except enrollment.EnrollmentRefused as exc:
            raise HTTPException(exc.status, str(exc)) from exc
        return {
            "node_id": rec.candidate_id,
            "release_key": ctx.release_key,
            "certificate": cert.decode(),
            "ca": ctx.ca.pem,
            "main_id": ctx.identity.node_id,
            "gateway_url": ctx.gateway_url,
        }

    # Join codes (letsinfer.authority.joining): the candidate checked this
    # main's CA against its code before it asks.
    challenges, guesses = joining.Challenges(), joining.GuessBudget()

    @app.get("/v1/join/challenge")
    async def join_challenge() -> dict[str, str]:
        return {"nonce": challenges.issue(), "main_id": ctx.identity.node_id}

    @app.post("/v1/join")
    async def join(body: Join, request: Request) -> dict[str, Any]:
        ask = joining.JoinAsk(
            code_id=body.code_id.upper(),
            nonce=body.nonce,
            proof=body.proof,
            csr=body.csr,
            node_id=body.node_id,
            name=body.name,
            agent_address=body.agent_address,
        )
        try:
            joined = joining.admit(
                store,
                ctx.ca,
                ctx.identity.node_id,
                challenges,
                guesses,
                ask,
                refusals(request, "node.join"),
            )
        except joining.JoinRefused as exc:
            headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
            raise HTTPException(exc.status, str(exc), headers=headers) from exc
        return {
            "node_id": joined.node_id,
            "release_key": ctx.release_key,
            "certificate": joined.certificate.decode(),
            "ca": ctx.ca.pem,
            "main_id": ctx.identity.node_id,
            "gateway_url": ctx.gateway_url,
        }

    @app.get("/v1/pair/ca")
    async def pair_ca() -> dict[str, Any]:
        # Public: a controller compares its fingerprint (through the comparison
        # string) before it sends its one-time code.
        return {"ca": ctx.ca.pem, "main_id": ctx.identity.node_id}

    @app.post("/v1/pair/controller")
    async def pair_controller(body: PairController, request: Request) -> dict[str, Any]:
        try:
            rec, cert = controllers.pair(
                store, ctx.ca, body.code, body.csr, refusals(request, "auth.controller.pair")
            )
        except controllers.PairingRefused as exc:
            raise HTTPException(exc.status, str(exc)) from exc
        return {
            "controller_id": rec.id,
            "role": rec.role,
            "certificate": cert.decode(),
            "ca": ctx.ca.pem,
            "main_id": ctx.identity.node_id,
        }

    @app.get("/v1/time")
    async def main_time() -> dict[str, float]:
        # Public: the main's clock says nothing secret, and a skewed child
        # compares with it before its facts go stale (`letsinfer doctor`).
        return {"time": time.time()}

    # -- nodes --------------------------------------------------------------
    @app.post("/v1/agent/pause")
    async def agent_pause(body: Pause, request: Request) -> dict[str, Any]:
        p = gated_peer(request)
        node = store.get_node(p.identity.id)
        assert node is not None
        lifecycle.set_node_paused(store, node, body.paused, actor=actor(p), role=node.role)
        await ctx.on_change()
        return {"node": node.name, "paused": body.paused}

    @app.get("/v1/agent/work")
    async def work(request: Request) -> dict[str, Any]:
        """What this main holds for the calling node: asked before it moves away."""
        p = gated_peer(request)
        node = store.get_node(p.identity.id)
        assert node is not None
        return {"node": node.name, "placement_groups": adoption.work_on_node(store, node.id)}

    @app.post("/v1/agent/renew")
    async def renew(body: Renew, request: Request) -> dict[str, Any]:
        p = gated_peer(request)
        try:
            csr = pki.load_csr(body.csr.encode())
        except pki.CertificateError as exc:
            raise HTTPException(400, str(exc)) from exc
        node = store.get_node(p.identity.id)
        assert node is not None
        cert = ctx.ca.issue_node(csr.public_key(), node.id, node.role)  # type: ignore[arg-type]
        fp = pki.fingerprint(pki.load_cert(cert))
        with store.transaction():
            store.set_node_fingerprint(node.id, fp)
            store.append_audit(
                actor(p), "node.certificate.renew", "ok", role=node.role, target=node.name
            )
        return {"certificate": cert.decode()}

    app.include_router(
        ops_router(
            store,
            ctx.identity,
            on_change=ctx.on_change,
            home=ctx.home,
            rollouts=ctx.rollouts or NoRollouts(),
            scene=ctx.scene,
            on_removed=ctx.on_removed,
            apply_exposure=ctx.apply_exposure,
        )
    )

    @app.get("/v1/ops/openapi.json", dependencies=[Depends(role_check(store, "viewer"))])
    async def admin_openapi() -> dict[str, Any]:
        from letsinfer.control.ops.openapi import admin_openapi

        return admin_openapi()

    def model_file(digest: str) -> Path | None:
        path = artifact_path(ctx.model_store, digest)
        return path if path.is_file() else None

    # Nodes fetch model files and imported artifacts by digest (Range resumes).
    app.include_router(artifact_router(ctx.mirror, also=model_file), prefix="/v1/agent")

    def admit(p: Peer, path: str) -> str | None:
        ident = p.identity
        node = store.get_node(ident.id, facts=False) if ident.kind == "node" else None
        if node is not None and node.state == "removed":
            # Said first, with its code: the node stops its engines on hearing it.
            return Refusal(
                f"this node ({node.name}) has been removed from the cluster; "
                "its certificate is revoked",
                NODE_REMOVED,
            )
        if store.is_revoked(ident.fingerprint):
            return "this certificate has been revoked"
        if ident.kind == "node":
            if node is None:
                return "this node is not a member of the cluster"
            return None if path.startswith("/v1/agent/") else "nodes may only use /v1/agent/*"
        rec = store.get_controller(ident.id)
        if rec is None or rec.state != "paired":
            return "this controller has been revoked"
        return None if path.startswith("/v1/ops/") else "controllers may only use /v1/ops/*"

    def denied(scope: Scope, p: Peer | None, reason: str) -> None:
        # Keyed by who and why, never by the path asked for (a flood could vary it).
        who = actor(p) if p is not None else f"anonymous:{(scope.get('client') or ('?',))[0]}"
        ctx.denials.note(who, "control:request", reason)

    def facts_refused(p: Peer, reason: str) -> None:
        ctx.denials.note(actor(p), "node.facts", reason)

    # Nodes' reports (every node, every heartbeat) take a route of their own.
    reports = FactsRoute(app, ctx.reports, facts_refused, ctx.heartbeat_interval_s)
    return PeerGate(reports, OPEN_PATHS, admit, denied)
