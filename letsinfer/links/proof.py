"""What a link proof signs, and its check.

The prober sends a random challenge to the peer's agent plane on the peer's
data address; the peer signs, with its node key (the key in its cluster
certificate), a message bound to both node ids, that address, the challenge
and the time. The prober, and later the main, verify it with the peer's
certificate key: a proof can be neither moved to another pair of nodes or
another address, nor signed by anyone but the peer.
"""

from __future__ import annotations

import base64
import re

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

_CONTEXT = b"letsinfer link proof v1\x00"
CHALLENGE = re.compile(r"[0-9a-f]{32,128}")


class LinkProofError(Exception):
    """A link is not proven; the message says exactly why."""


def message(prober: str, peer: str, address: str, challenge: str, ts: float) -> bytes:
    if not CHALLENGE.fullmatch(challenge):
        raise LinkProofError("a challenge is 32 to 128 lowercase hex digits")
    fields = (prober, peer, address, challenge, f"{ts:.6f}")
    if any("\x00" in f for f in fields):
        raise LinkProofError("a link proof field holds a NUL byte")
    return _CONTEXT + "\x00".join(fields).encode()


def sign(
    key: ec.EllipticCurvePrivateKey,
    prober: str,
    peer: str,
    address: str,
    challenge: str,
    ts: float,
) -> str:
    body = message(prober, peer, address, challenge, ts)
    return base64.b64encode(key.sign(body, ec.ECDSA(hashes.SHA256()))).decode()


def verify(
    public_key: object,
    signature: str,
    prober: str,
    peer: str,
    address: str,
    challenge: str,
    ts: float,
) -> None:
    """Raise LinkProofError unless ``peer``'s key signed exactly this proof."""
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise LinkProofError(f"node {peer}'s certificate has no P-256 key")
    try:
        raw = base64.b64decode(signature, validate=True)
    except ValueError as exc:
        raise LinkProofError("the link proof's signature is not base64") from exc
    try:
        public_key.verify(
            raw, message(prober, peer, address, challenge, ts), ec.ECDSA(hashes.SHA256())
        )
    except InvalidSignature as exc:
        raise LinkProofError(
            f"the link proof for {prober} -> {peer} at {address} is not signed by {peer}'s key"
        ) from exc
