"""Signed facts: what an agent tells the main about its node.

Bounded (every number has a range and is finite, every list and string a
limit: an enrolled node is not trusted to send sane values), canonical JSON,
signed with the node's own key (ECDSA P-256, SHA-256), with a sequence number
and a timestamp so the main can refuse forged, replayed and stale facts.
"""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from letsinfer.bounded_text import bounded

_ID = Field(max_length=64)
_INT32 = 2**31 - 1
_BYTES = 2**60  # more memory than any machine has, and still exact as JSON
# Seconds since the epoch, in the years 2001-2286: a sane clock, never NaN.
_TS = Field(ge=1e9, le=1e10)


class _Fact(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GpuFact(_Fact):
    uuid: str = _ID
    name: str = Field(max_length=128)
    memory_total: int = Field(ge=0, le=_BYTES)
    memory_free: int = Field(ge=0, le=_BYTES)
    temperature_c: int | None = Field(None, ge=-100, le=1000)
    power_w: float | None = Field(None, ge=0, le=1e6)
    utilization: int | None = Field(None, ge=0, le=100)
    mig: bool = False


class PlacementFact(_Fact):
    pg_id: str = _ID
    task: str = Field("0", max_length=16)
    state: str = Field(max_length=16)
    base_url: str | None = Field(None, max_length=256)
    pid: int | None = Field(None, ge=0, le=_INT32)
    restarts: int = Field(0, ge=0, le=_INT32)
    capacity: int | None = Field(None, ge=0, le=4096)
    detail: str | None = Field(None, max_length=512)
    generation: int = Field(0, ge=0)  # of the placement this engine runs
    # The serving engine's own load, read from it by the agent (llama.cpp's
    # /slots and /metrics); None when the engine does not say.
    slots_free: int | None = Field(None, ge=0, le=4096)
    queue_depth: int | None = Field(None, ge=0, le=1_000_000)
    # The LoRA adapters the engine loaded, in load order (a request's adapter id
    # is the index): only these are routed to it.
    adapters: list[Annotated[str, Field(max_length=128)]] = Field(
        default_factory=list, max_length=64
    )
    # Their files' sha256, in the same order (empty from agents before it): the
    # main routes an adapter to the engine only if it loaded the file the
    # authority holds under that name now.
    adapter_digests: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list, max_length=64
    )


class LinkFact(_Fact):
    """A data link this node proved to ``peer``: the peer's signature over the
    challenge this node sent to ``address`` (see letsinfer.links.proof)."""

    peer: str = _ID
    address: str = Field(max_length=64)  # the peer's data address
    proven_at: float = _TS  # the peer's clock, signed
    challenge: str = Field(max_length=128)
    signature: str = Field(max_length=256)
    interface: str = Field(max_length=32)  # the on-link interface the route uses


class AuditHeadFact(_Fact):
    """The node's signed audit head (letsinfer.audit.anchor), and what its
    own O(1) check against its database found wrong, if anything."""

    count: int = Field(ge=1, le=2**62)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    signature: str = Field(max_length=256)
    problem: str | None = Field(None, max_length=512)


class Facts(_Fact):
    node_id: str = _ID
    seq: int = Field(ge=1, le=2**62)
    ts: float = _TS
    cpus: int = Field(ge=1, le=4096)
    memory_bytes: int = Field(ge=0, le=_BYTES)
    memory_available: int | None = Field(None, ge=0, le=_BYTES)  # for the memory-fit check
    targets: list[Annotated[str, Field(max_length=16)]] = Field(max_length=8)
    gpus: list[GpuFact] = Field(default_factory=list, max_length=64)
    placements: list[PlacementFact] = Field(default_factory=list, max_length=256)
    links: list[LinkFact] = Field(default_factory=list, max_length=64)
    version: str = Field(max_length=32)
    paused: bool = False
    audit: AuditHeadFact | None = None
    # Digests of the model files the node holds: the main names the nodes that
    # download a model again when its groups start (see storage/refetch.py).
    artifacts: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list, max_length=256
    )
    # nftables table inet letsinfer loaded (None: the agent cannot tell)
    firewall: bool | None = None

    def canonical(self) -> bytes:
        return json.dumps(
            self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")
        ).encode()


def sign(facts: Facts, key: ec.EllipticCurvePrivateKey) -> dict[str, str]:
    body = facts.canonical()
    signature = key.sign(body, ec.ECDSA(hashes.SHA256()))
    return {"facts": body.decode(), "signature": base64.b64encode(signature).decode()}


class FactError(Exception):
    """Facts refused; ``reason`` is the kind of refusal (what the audit chain
    counts), the message says exactly what was wrong."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


def verify(envelope: dict[str, Any], public_key: ec.EllipticCurvePublicKey) -> Facts:
    """Check the signature over the exact bytes sent, then parse them."""
    try:
        body = str(envelope["facts"]).encode()
        signature = base64.b64decode(str(envelope["signature"]), validate=True)
    except (KeyError, ValueError) as exc:
        raise FactError("malformed fact envelope") from exc
    try:
        public_key.verify(signature, body, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as exc:
        raise FactError("the facts' signature does not verify with this node's key") from exc
    try:
        return Facts.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"]]
        if first["type"] == "extra_forbidden" and loc:
            # The field's name is the peer's text: shown bounded, and the kind
            # of refusal (what the audit chain counts) is where, not which name.
            name = bounded(loc.pop())
            where = ".".join(loc) or "facts"
            raise FactError(
                f"facts out of bounds or malformed ({where}: unknown field '{name}')",
                f"facts out of bounds or malformed ({where}: unknown field)",
            ) from exc
        where = ".".join(loc) or "facts"
        raise FactError(
            f"facts out of bounds or malformed ({where}: {bounded(first['msg'], 200)})",
            f"facts out of bounds or malformed ({where})",
        ) from exc
