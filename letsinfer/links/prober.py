"""The agent's side of link proofs: challenge each peer its tasks need, keep the
latest proofs for the signed facts.

A proof is made over mutual TLS with the cluster CA, to the peer's agent plane
on the peer's data address; the answer counts only if the certificate is the
peer's (its node id), the signature verifies with that certificate's key, and
the kernel reaches the address directly (on-link, no gateway). A failed probe
removes the link from this node's facts at once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
import time
from dataclasses import dataclass, field

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.contracts.facts import LinkFact
from letsinfer.engines.parallel_command import GroupTask
from letsinfer.links import proof, route
from letsinfer.trust import pki
from letsinfer.trust.client import PeerMismatch, peer_certificate
from letsinfer.trust.peer import Presenting

log = logging.getLogger("letsinfer.links")

CHALLENGE_PATH = "/v1/link/challenge"


async def prove(client: httpx.AsyncClient, prober: str, peer: GroupTask) -> LinkFact:
    """One proof of the link to ``peer``, or LinkProofError saying why not."""
    # pyroute2's IPRoute runs its own event loop: ask the kernel from a thread.
    interface = await asyncio.to_thread(route.require_direct, peer.address)
    port = peer.agent.rsplit(":", 1)[1]
    challenge = secrets.token_hex(32)
    url = f"https://{peer.address}:{port}{CHALLENGE_PATH}"
    try:
        resp = await client.post(
            url,
            json={
                "prober": prober,
                "peer": peer.node_id,
                "address": peer.address,
                "challenge": challenge,
            },
        )
        cert = pki.load_cert(peer_certificate(resp))
    except (httpx.HTTPError, PeerMismatch, OSError, ssl.SSLError) as exc:
        raise proof.LinkProofError(f"cannot reach {peer.address}:{port}: {exc}") from exc
    ident = pki.identity_of(cert)
    if ident.kind != "node" or ident.id != peer.node_id:
        raise proof.LinkProofError(
            f"{peer.address} answered as {ident.kind} {ident.id}, not node {peer.node_id}"
        )
    if resp.status_code != 200:
        raise proof.LinkProofError(f"{peer.address} refused the challenge: {resp.text[:200]}")
    body = resp.json()
    ts, signature = float(body["ts"]), str(body["signature"])
    proof.verify(cert.public_key(), signature, prober, peer.node_id, peer.address, challenge, ts)
    return LinkFact(
        peer=peer.node_id,
        address=peer.address,
        proven_at=ts,
        challenge=challenge,
        signature=signature,
        interface=interface,
    )


@dataclass
class LinkProber:
    node_id: str
    tls: Presenting
    timeout_s: float
    proven: dict[str, LinkFact] = field(default_factory=dict)  # peer node id -> proof
    _failing: dict[str, str] = field(default_factory=dict)

    async def probe(self, peers: list[GroupTask]) -> None:
        wanted = {p.node_id: p for p in peers if p.node_id != self.node_id}
        for gone in set(self.proven) - set(wanted):
            del self.proven[gone]
        async with httpx.AsyncClient(verify=self.tls.context, timeout=self.timeout_s) as client:
            for peer in wanted.values():
                try:
                    self.proven[peer.node_id] = await prove(client, self.node_id, peer)
                except proof.LinkProofError as exc:
                    self.proven.pop(peer.node_id, None)
                    if self._failing.get(peer.node_id) != str(exc):
                        log.warning("data link to %s not proven: %s", peer.node_id, exc)
                    self._failing[peer.node_id] = str(exc)
                    continue
                if self._failing.pop(peer.node_id, None) is not None:
                    log.info("data link to %s proven again", peer.node_id)

    def facts(self) -> list[LinkFact]:
        return list(self.proven.values())


def answer(
    key: ec.EllipticCurvePrivateKey, prober: str, peer: str, address: str, challenge: str
) -> dict[str, object]:
    """The peer's side: sign the challenge (checks are the caller's)."""
    ts = time.time()
    return {"ts": ts, "signature": proof.sign(key, prober, peer, address, challenge, ts)}
