"""The agent plane (each node, :8444): the main calls it; candidates are reached here.

Open paths: ``/v1/identity`` (public identity, as in mDNS) and
``/v1/enroll/request`` (a main's pinned request; refused while this node
belongs to a cluster, unless the operator opened a move with
``letsinfer node move-into``). Everything else only for this node's main.
"""

import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from letsinfer import __version__
from letsinfer.audit.denials import DenialLog
from letsinfer.control.typed_app import typed_app
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.links import proof
from letsinfer.links.prober import CHALLENGE_PATH, answer
from letsinfer.store import AuthorityStore
from letsinfer.trust import candidate, pki
from letsinfer.trust.material import tls_files
from letsinfer.trust.peer import Peer, PeerGate, Scope

OPEN_PATHS = ("/v1/identity", "/v1/enroll/request")
REMOVED_PATH = "/v1/agent/removed"
REPORT_NOW_PATH = "/v1/agent/report-now"


class EnrollRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # (An open path: each field is held to what a main sends, with room to spare.)
    enrollment_id: str = Field(max_length=64)
    main_id: str = Field(max_length=64)
    main_name: str = Field(max_length=253)
    main_address: str = Field(max_length=300)
    ca: str = Field(max_length=16384)
    token: str = Field(max_length=256)
    expires_at: float = Field(allow_inf_nan=False)
    gateway_url: str | None = Field(default=None, max_length=2048)
    # The main's node certificate and its signature over this request (see
    # trust/request_proof): without them a request proves nothing and is refused.
    main_cert: str | None = Field(default=None, max_length=16384)
    signature: str | None = Field(default=None, max_length=256)


class LinkChallenge(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prober: str = Field(max_length=64)
    peer: str = Field(max_length=64)
    address: str = Field(max_length=64)
    challenge: str = Field(max_length=128)


def adoption_window(home: Home) -> dict[str, Any] | None:
    path = home.move_window
    if not path.exists():
        return None
    window = json.loads(path.read_text())
    return window if time.time() < window["until"] else None


def create_agent_app(
    home: Home,
    identity: Callable[[], NodeIdentity],
    fingerprint: Callable[[], str],
    audit: AuthorityStore,
    denials: DenialLog,
    lifespan: Any = None,
    revoked: Callable[[str], bool] = lambda fingerprint: False,
    on_removed: Callable[[str], Awaitable[int]] | None = None,
    on_report_now: Callable[[], None] | None = None,
) -> PeerGate:
    """``on_removed(main_name)`` stops this node's engines when its main says it
    removed the node, and returns how many it stopped; ``on_report_now()``
    makes a child send its facts now, not at its next heartbeat."""
    app = typed_app("letsinfer agent", lifespan=lifespan)

    @app.get("/v1/identity")
    async def who() -> dict[str, Any]:
        ident = identity()
        return {
            "node_id": ident.node_id,
            "name": ident.name,
            "role": ident.role,
            "fingerprint": fingerprint(),  # the certificate presented now
        }

    @app.post("/v1/enroll/request")
    async def enroll_request(body: EnrollRequest, request: Request) -> dict[str, Any]:
        ident = identity()
        # Anyone may ask (an open path): its records name the address it came
        # from, never the name or address the request gives itself.
        client = request.client.host if request.client else "?"
        if ident.enrolled:
            window = adoption_window(home)
            if window is None or window["main"] != body.main_address:
                where = ident.main_address or "itself (it is a main)"
                why = (
                    f"node {ident.name} already belongs to a cluster (main: {where}); "
                    "it is never adopted silently: run `letsinfer node move-into "
                    f"--main {body.main_address}` on it first"
                )
                denials.note(
                    f"anonymous:{client}",
                    "node.enroll.request",
                    "already belongs to a cluster: adoption needs `node move-into` first",
                )
                raise HTTPException(409, why)
        req = candidate.PendingRequest(
            id=body.enrollment_id,
            main_id=body.main_id,
            main_name=body.main_name,
            main_address=body.main_address,
            ca_pem=body.ca,
            token=body.token,
            expires_at=body.expires_at,
            received_at=time.time(),
            gateway_url=body.gateway_url,
            main_cert=body.main_cert,
            signature=body.signature,
            received_from=client,
        )
        try:
            room = candidate.store_request(home, req, ident.node_id)
        except candidate.UnprovenRequest as exc:
            # Dropped before anything kept is touched; counted by source address.
            denials.note(
                f"anonymous:{client}",
                "node.enroll.request",
                "the request does not prove the key of the main it names",
            )
            raise HTTPException(403, f"enrollment request refused: {exc}") from exc
        except (candidate.EnrollmentError, pki.CertificateError, ValueError) as exc:
            raise HTTPException(400, f"malformed enrollment request: {exc}") from exc
        if room:
            audit.append_audit(
                f"main:{body.main_name}",
                "node.enroll.request",
                "ok",
                target=ident.name,
                detail=f"{req.id} from {client}, cluster CA sha256:{req.ca_fingerprint}",
            )
        else:  # a flood: counted by address, one record a window, not one each
            denials.note(
                f"anonymous:{client}",
                "node.enroll.request",
                f"more than {candidate.MAX_PENDING} pending requests: "
                "the oldest of the sender holding the most made room",
            )
        return {
            "status": "pending",
            "node_id": ident.node_id,
            "accept_with": f"letsinfer node accept {body.enrollment_id}",
        }

    @app.get("/v1/agent/info")
    async def info() -> dict[str, Any]:
        ident = identity()
        return {
            "node_id": ident.node_id,
            "name": ident.name,
            "role": ident.role,
            "version": __version__,
            "cpus": os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        }

    @app.post(REMOVED_PATH)
    async def removed(request: Request) -> dict[str, Any]:
        """The main removed this node: its engines stop now (only the main gets here)."""
        if on_removed is None:
            raise HTTPException(409, "this node cannot be removed: it is the main")
        peer: Peer = request.scope["state"]["peer"]
        stopped = await on_removed(f"main:{peer.identity.id}")
        return {"node": identity().name, "engines_stopped": stopped}

    @app.post(REPORT_NOW_PATH)
    async def report_now() -> dict[str, Any]:
        """The main placed or changed work for this node: report now, and get
        the main's word in the answer (only the main gets here)."""
        if on_report_now is None:
            raise HTTPException(409, "this node does not report: it is the main")
        on_report_now()
        return {"node": identity().name, "reporting": True}

    @app.post(CHALLENGE_PATH)
    async def link_challenge(body: LinkChallenge, request: Request) -> dict[str, Any]:
        """Sign a peer node's challenge, bound to both ids and the address the
        challenge arrived on (this node's data address)."""
        ident = identity()
        peer: Peer = request.scope["state"]["peer"]
        local = (request.scope.get("server") or ("", 0))[0]
        if body.peer != ident.node_id:
            raise HTTPException(409, f"this is node {ident.node_id}, not {body.peer}")
        if body.prober != peer.identity.id:
            raise HTTPException(403, "the prober must be the node whose certificate calls")
        if body.address != local:
            raise HTTPException(409, f"the challenge arrived on {local}, not {body.address}")
        key = pki.read_private_key(tls_files(home, ident).key)
        try:
            return answer(key, body.prober, body.peer, body.address, body.challenge)
        except proof.LinkProofError as exc:
            raise HTTPException(400, str(exc)) from exc

    def admit(peer: Peer, path: str) -> str | None:
        ident = identity()
        p = peer.identity
        if revoked(p.fingerprint):
            return "this certificate has been revoked"
        if p.kind == "node" and p.role == "main" and p.id == ident.main_id:
            return None
        if path == CHALLENGE_PATH and p.kind == "node" and ident.enrolled:
            return None  # a member of this node's cluster (its CA verified the certificate)
        return "only this node's main may use the agent API"

    def denied(scope: Scope, peer: Peer | None, reason: str) -> None:
        # Keyed by who and why, never by the path asked for (a flood could vary it).
        client = (scope.get("client") or ("?",))[0]
        who = f"{peer.identity.kind}:{peer.identity.id}" if peer else f"anonymous:{client}"
        denials.note(who, "agent:request", reason)

    return PeerGate(app, OPEN_PATHS, admit, denied)
