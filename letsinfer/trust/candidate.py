"""A candidate's side of enrollment: requests it received, and local acceptance.

A request is kept (0600) only when it proves the main's key (see
``request_proof``), until it is accepted, rejected or expires. Accepting
sends a CSR for this node's own key to the main named in the request,
verifying the main against the CA in that request, then switches this node
into the cluster in one atomic step (node.json is replaced last).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import ssl
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx
from cryptography import x509

from letsinfer.home import Home
from letsinfer.identity import NodeIdentity, load_identity, save_identity
from letsinfer.trust import pki, request_proof
from letsinfer.trust.client import PeerMismatch, peer_certificate
from letsinfer.trust.material import ensure_node_key


class EnrollmentError(Exception):
    pass


class UnprovenRequest(EnrollmentError):
    """A request its sender could have made without the main's key."""


@dataclass(frozen=True)
class PendingRequest:
    id: str
    main_id: str
    main_name: str
    main_address: str
    ca_pem: str
    token: str
    expires_at: float  # as its main signed it; kept until `keep_until`
    received_at: float
    gateway_url: str | None = None
    main_cert: str | None = None  # the main's node certificate, and its signature
    signature: str | None = None
    received_from: str | None = None  # the address it came from (not its own words)

    @property
    def ca_fingerprint(self) -> str:
        return pki.fingerprint(pki.load_cert(self.ca_pem.encode()))

    def prove(self, candidate_id: str) -> None:
        """Raise EnrollmentError unless the main named in this request, of the
        cluster of its CA, signed it for the candidate ``candidate_id``."""
        try:
            request_proof.verify(
                request_proof.message(
                    enrollment_id=self.id,
                    candidate_id=candidate_id,
                    main_id=self.main_id,
                    main_name=self.main_name,
                    main_address=self.main_address,
                    ca_pem=self.ca_pem,
                    token=self.token,
                    expires_at=self.expires_at,
                    gateway_url=self.gateway_url,
                ),
                main_cert_pem=self.main_cert,
                signature=self.signature,
                ca_pem=self.ca_pem,
                main_id=self.main_id,
            )
        except (request_proof.RequestProofError, pki.CertificateError) as exc:
            raise UnprovenRequest(
                f"request {self.id} does not prove the key of the main it names: {exc}"
            ) from exc

    @property
    def keep_until(self) -> float:
        """Its expiry, and at most MAX_KEEP_S after it arrived."""
        return min(self.expires_at, self.received_at + MAX_KEEP_S)

    @property
    def expired(self) -> bool:
        return time.time() > self.keep_until


def _path(home: Home, request_id: str) -> Path:
    if not request_id.replace("-", "").isalnum():
        raise EnrollmentError(f"invalid request id {request_id!r}")
    return home.enrollment_dir / f"{request_id}.json"


# Requests arrive on an open path, so what a candidate keeps is bounded: a
# request lives at most a week here (whatever expiry it names), and past
# MAX_PENDING the oldest of the sender (address) that holds the most goes: a
# flood cannot fill the disk, and one sender's flood (of requests its own
# cluster signed) makes room from its own requests, not the main's.
MAX_PENDING = 32
MAX_KEEP_S = 7 * 86400.0


def store_request(home: Home, req: PendingRequest, candidate_id: str) -> bool:
    """Keep ``req`` once it proves the main's key (UnprovenRequest otherwise:
    nothing kept, nothing else touched); False when an older request had to
    go to make room."""
    pki.load_cert(req.ca_pem.encode())  # refuse garbage before keeping it
    if not math.isfinite(req.expires_at):
        raise EnrollmentError(f"request {req.id}: its expiry is not a time")
    req.prove(candidate_id)  # before anything is evicted or replaced
    home.enrollment_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = _path(home, req.id)
    kept = _kept(home)  # each proven as it came
    same = [r for r in kept if r.id == req.id]
    if same and (same[0].main_id, same[0].ca_pem) != (req.main_id, req.ca_pem):
        raise EnrollmentError(f"request {req.id} is already pending from another main")
    kept = [r for r in kept if r.id != req.id]
    evicted = []
    while len(kept) + 1 > MAX_PENDING:
        held = Counter(r.received_from for r in [*kept, req])
        victim = min(kept, key=lambda r: (-held[r.received_from], r.received_at))
        kept.remove(victim)
        evicted.append(victim)
    for old in evicted:
        _path(home, old.id).unlink(missing_ok=True)
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(req), fh)
    path.with_suffix(".tmp").replace(path)
    return not evicted


def _kept(home: Home) -> list[PendingRequest]:
    """The requests on disk; expired ones are dropped on the way."""
    out = []
    if not home.enrollment_dir.exists():
        return out
    for path in sorted(home.enrollment_dir.glob("*.json")):
        req = PendingRequest(**json.loads(path.read_text()))
        if req.expired:
            path.unlink(missing_ok=True)
            continue
        out.append(req)
    return out


def list_requests(home: Home, candidate_id: str) -> list[PendingRequest]:
    """Pending requests for the candidate ``candidate_id`` (this node). One
    that does not prove the main's key (kept by a release that did not check)
    is dropped on the way, like an expired one."""
    out = []
    for req in _kept(home):
        try:
            req.prove(candidate_id)
        except UnprovenRequest:
            drop_request(home, req.id)
            continue
        out.append(req)
    return out


def get_request(home: Home, request_id: str, candidate_id: str) -> PendingRequest:
    for req in list_requests(home, candidate_id):
        if req.id == request_id:
            return req
    raise EnrollmentError(
        f"no pending enrollment request {request_id!r} "
        "(see `letsinfer node requests`; requests expire)"
    )


def check_cluster(req: PendingRequest, expected: str) -> None:
    """Refuse a request whose cluster CA is not the expected one: the CA is the
    only thing in a request that a LAN host cannot choose (names and addresses
    are the requester's own words)."""
    if req.ca_fingerprint != expected:
        raise EnrollmentError(
            f"request {req.id} comes from the cluster whose CA fingerprint is "
            f"sha256:{req.ca_fingerprint} (main {req.main_name!r} at {req.main_address}), "
            f"not sha256:{expected}: not accepted, nothing changed "
            f"(reject it with `letsinfer node reject {req.id}`)"
        )


def drop_request(home: Home, request_id: str) -> None:
    _path(home, request_id).unlink(missing_ok=True)


def accept(
    home: Home, identity: NodeIdentity, req: PendingRequest, agent_address: str | None
) -> NodeIdentity:
    """Send the CSR, receive the certificate, switch clusters atomically."""
    key = ensure_node_key(home)
    ca = pki.load_cert(req.ca_pem.encode())
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cadata=req.ca_pem)
    body = {
        "enrollment_id": req.id,
        "token": req.token,
        "csr": pki.make_csr(key, identity.node_id).decode(),
        "agent_address": agent_address,
    }
    try:
        with httpx.Client(verify=ctx, timeout=15) as client:
            resp = client.post(f"https://{req.main_address}/v1/enroll/complete", json=body)
            server_der = peer_certificate(resp)
    except (httpx.HTTPError, PeerMismatch) as exc:
        raise EnrollmentError(f"cannot reach the main at {req.main_address}: {exc}") from exc
    server = pki.identity_of(pki.load_cert(server_der))
    if server.kind != "node" or server.id != req.main_id or server.role != "main":
        raise EnrollmentError(f"{req.main_address} is not the main that sent this request")
    if resp.status_code != 200:
        message = resp.json().get("error", {}).get("message", resp.text)
        raise EnrollmentError(f"the main refused: {message}")
    cert = pki.load_cert(resp.json()["certificate"].encode())
    pki.verify_issued_by(cert, ca)
    ident = pki.identity_of(cert)
    if ident.id != identity.node_id or pki.public_key_fingerprint(
        cert
    ) != pki.public_key_fingerprint(key.public_key()):
        raise EnrollmentError("the main issued a certificate for another identity")

    moved = install_membership(
        home,
        identity,
        ca,
        cert,
        release_key=resp.json().get("release_key"),
        main_address=req.main_address,
        main_id=req.main_id,
        gateway_url=req.gateway_url or resp.json().get("gateway_url"),
    )
    drop_request(home, req.id)
    return moved


def install_membership(
    home: Home,
    identity: NodeIdentity,
    ca: x509.Certificate,
    cert: x509.Certificate,
    *,
    release_key: str | None,
    main_address: str,
    main_id: str,
    gateway_url: str | None,
) -> NodeIdentity:
    """Write the cluster's CA and this node's certificate, then switch this
    node into that cluster (node.json is replaced last: the commit point)."""
    cluster = pki.fingerprint(ca)
    target = home.cluster_dir(cluster)
    staging = target.with_name(target.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    pki.write_pem(staging / "ca.crt", pki.cert_pem(ca))
    pki.write_pem(staging / "node.crt", pki.cert_pem(cert))
    if release_key:  # what vouches for the main's runtime releases
        (staging / "release.pub").write_text(release_key + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    previous = load_identity(home.identity_file)
    moved = replace(
        identity,
        role="child",
        main_address=main_address,
        main_id=main_id,
        cluster=cluster,
        gateway_url=gateway_url,
    )
    save_identity(home.identity_file, moved)  # the commit point
    if previous is not None and previous.cluster and previous.cluster != cluster:
        shutil.rmtree(home.cluster_dir(previous.cluster), ignore_errors=True)
    return moved
