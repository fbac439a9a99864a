"""The main's check of incoming facts: identity, signature, freshness, sequence
(persisted by the caller, so it holds across restarts), the link proofs and
the signed audit head they carry.

Facts that pass become the node's current view; routing uses only fresh facts.
A link proof is checked with the peer's certificate key (known once the peer
has sent facts itself): a proof the peer's key did not sign refuses the facts.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.audit.anchor import SignedHead, signature_valid
from letsinfer.contracts.facts import FactError, Facts, LinkFact, verify
from letsinfer.links import proof
from letsinfer.trust import pki
from letsinfer.trust.peer import Peer


@dataclass
class NodeView:
    facts: Facts
    received_at: float  # the ledger's clock (the main's attention clock)


@functools.lru_cache(maxsize=8192)
def _cert_key(der: bytes) -> ec.EllipticCurvePublicKey:
    """A node certificate's key, parsed once per certificate (not per report)."""
    key = pki.load_cert(der).public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise FactError("the node's certificate has no P-256 key")
    return key


@dataclass
class FactLedger:
    max_skew_s: float = 30.0
    views: dict[str, NodeView] = field(default_factory=dict)
    last_seq: dict[str, int] = field(default_factory=dict)
    keys: dict[str, ec.EllipticCurvePublicKey] = field(default_factory=dict)  # node -> cert key
    # Monotonic seconds; on a main, its attention clock (letsinfer.authority.overload),
    # which stands still while the main sheds load: nodes do not age meanwhile.
    clock: Callable[[], float] = time.monotonic

    def accept(
        self,
        peer: Peer,
        peer_cert_der: bytes,
        envelope: dict[str, object],
        now: float | None = None,
        persisted_seq: int | None = None,
    ) -> Facts:
        """Raise FactError with the reason, or record and return the facts.
        ``persisted_seq``: the last sequence the authority stored for the node,
        so a replay is refused after the main restarts as well."""
        try:
            key = _cert_key(peer_cert_der)
        except pki.CertificateError as exc:
            raise FactError("the node's certificate cannot be read") from exc
        facts = verify(envelope, key)
        if facts.node_id != peer.identity.id:
            raise FactError(
                f"facts for node {facts.node_id} sent by node {peer.identity.id}",
                "facts for another node",
            )
        wall = time.time() if now is None else now
        if not abs(wall - facts.ts) <= self.max_skew_s:  # written so NaN is refused too
            raise FactError(
                f"stale facts: {wall - facts.ts:.0f}s from the main's clock", "stale facts"
            )
        last = max(self.last_seq.get(facts.node_id, 0), persisted_seq or 0)
        if facts.seq <= last:
            raise FactError(f"replayed facts: sequence {facts.seq} after {last}", "replayed facts")
        for link in facts.links:
            self._check_link(facts.node_id, link)
        if facts.audit is not None and not self._same_head(facts, key):
            head = SignedHead(facts.audit.count, facts.audit.hash, facts.audit.signature)
            if not signature_valid(head, key):
                raise FactError(
                    "the audit head's signature does not verify with this node's key",
                    "forged audit head",
                )
        self.last_seq[facts.node_id] = facts.seq
        self.keys[facts.node_id] = key
        self.views[facts.node_id] = NodeView(facts, self.clock())
        return facts

    def _same_head(self, facts: Facts, key: ec.EllipticCurvePublicKey) -> bool:
        """The audit head this node's last accepted facts carried, signature and
        all, verified then with the same key: most reports repeat it."""
        view = self.views.get(facts.node_id)
        before = view.facts.audit if view is not None else None
        now = facts.audit
        return (
            before is not None
            and now is not None
            and self.keys.get(facts.node_id) is key
            and (before.count, before.hash, before.signature)
            == (now.count, now.hash, now.signature)
        )

    def _check_link(self, prober: str, link: LinkFact) -> None:
        if link.peer == prober:
            raise FactError("a node cannot prove a link to itself", "refused link proof")
        peer_key = self.keys.get(link.peer)
        if peer_key is None:
            return  # not checkable yet: verified_links() does not count it
        try:
            proof.verify(
                peer_key,
                link.signature,
                prober,
                link.peer,
                link.address,
                link.challenge,
                link.proven_at,
            )
        except proof.LinkProofError as exc:
            raise FactError(f"refused link proof: {exc}", "refused link proof") from exc

    def verified_links(
        self, node_id: str, within_s: float, proof_ttl_s: float, now: float | None = None
    ) -> dict[str, LinkFact]:
        """The links a fresh view of ``node_id`` proves, each checked against
        the peer's key and no older than ``proof_ttl_s`` (peer's signed clock)."""
        facts = self.fresh(node_id, within_s)
        if facts is None:
            return {}
        wall = time.time() if now is None else now
        out = {}
        for link in facts.links:
            key = self.keys.get(link.peer)
            if key is None or abs(wall - link.proven_at) > proof_ttl_s:
                continue
            try:
                proof.verify(
                    key,
                    link.signature,
                    node_id,
                    link.peer,
                    link.address,
                    link.challenge,
                    link.proven_at,
                )
            except proof.LinkProofError:
                continue
            out[link.peer] = link
        return out

    def fresh(self, node_id: str, within_s: float) -> Facts | None:
        view = self.views.get(node_id)
        if view is None or self.clock() - view.received_at > within_s:
            return None
        return view.facts
