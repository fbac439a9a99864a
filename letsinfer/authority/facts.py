"""The main's check of incoming facts: identity, signature, freshness, sequence.

Facts that pass become the node's current view; routing uses only fresh facts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.agent.facts import FactError, Facts, verify
from letsinfer.trust import pki
from letsinfer.trust.peer import Peer


@dataclass
class NodeView:
    facts: Facts
    received_at: float  # main's monotonic clock


@dataclass
class FactLedger:
    max_skew_s: float = 30.0
    views: dict[str, NodeView] = field(default_factory=dict)
    last_seq: dict[str, int] = field(default_factory=dict)

    def accept(
        self,
        peer: Peer,
        peer_cert_der: bytes,
        envelope: dict[str, object],
        now: float | None = None,
    ) -> Facts:
        """Raise FactError with the reason, or record and return the facts."""
        cert = pki.load_cert(peer_cert_der)
        key = cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise FactError("the node's certificate has no P-256 key")
        facts = verify(envelope, key)
        if facts.node_id != peer.identity.id:
            raise FactError(f"facts for node {facts.node_id} sent by node {peer.identity.id}")
        wall = time.time() if now is None else now
        if abs(wall - facts.ts) > self.max_skew_s:
            raise FactError(f"stale facts: {wall - facts.ts:.0f}s from the main's clock")
        last = self.last_seq.get(facts.node_id, 0)
        if facts.seq <= last:
            raise FactError(f"replayed facts: sequence {facts.seq} after {last}")
        self.last_seq[facts.node_id] = facts.seq
        self.views[facts.node_id] = NodeView(facts, time.monotonic())
        return facts

    def fresh(self, node_id: str, within_s: float) -> Facts | None:
        view = self.views.get(node_id)
        if view is None or time.monotonic() - view.received_at > within_s:
            return None
        return view.facts
