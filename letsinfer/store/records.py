"""The records the authority's store returns and takes, its error, and the
converters from a table's row to its record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class StoreError(Exception):
    """The store refused a change (a constraint) or cannot be read."""


@dataclass(frozen=True)
class NodeRecord:
    id: str
    name: str
    role: str
    address: str | None
    state: str
    paused: bool
    created_at: float
    cert_fingerprint: str | None = None
    last_seen: float | None = None
    facts: dict[str, Any] | None = None  # latest verified hardware facts
    facts_at: float | None = None
    removed_at: float | None = None
    facts_seq: int | None = None  # the last accepted facts' sequence (refuses replays)
    audit_head: dict[str, Any] | None = None  # its signed audit head, as witnessed
    audit_problem: str | None = None  # what the witnessed head says is wrong
    cert_not_after: float | None = None  # expiry of the certificate it last presented


@dataclass(frozen=True)
class Witness:
    """A node's signed audit head as the main last accepted it, and what is wrong."""

    head: dict[str, Any] | None
    problem: str | None


@dataclass(frozen=True)
class NodeEntry:
    """A node's membership (no facts): what changes rarely, read by revision."""

    id: str
    name: str
    role: str
    address: str | None
    state: str
    paused: bool
    cert_fingerprint: str | None
    rev: int  # the `nodes` revision of its last change


@dataclass(frozen=True)
class FactsUpdate:
    """One node's accepted facts, as a batch writes them (see record_facts_batch)."""

    node_id: str
    facts: dict[str, Any]  # the hardware part the main keeps
    at: float  # when the main accepted them (its wall clock)
    seq: int
    cert_fingerprint: str | None = None
    witness: Witness | None = None
    cert_not_after: float | None = None

    def row(self) -> tuple[Any, ...]:
        """As the batch stores it: node id, facts (JSON), at, certificate
        fingerprint, its expiry, seq, witnessed, audit head (JSON), problem."""
        witness = self.witness
        return (
            self.node_id,
            json.dumps(self.facts, sort_keys=True),
            self.at,
            self.cert_fingerprint,
            self.cert_not_after,
            self.seq,
            witness is not None,
            json.dumps(witness.head, sort_keys=True) if witness and witness.head else None,
            witness.problem if witness else None,
        )


@dataclass(frozen=True)
class EnrollmentRecord:
    id: str
    candidate_id: str
    name: str
    address: str
    pubkey_sha256: str
    token_digest: str
    state: str
    detail: str | None
    created_at: float
    expires_at: float


@dataclass(frozen=True)
class ControllerRecord:
    id: str
    name: str
    role: str
    state: str
    code_digest: str | None
    code_expires_at: float | None
    cert_fingerprint: str | None
    created_at: float
    paired_at: float | None
    revoked_at: float | None


@dataclass(frozen=True)
class ServiceRecord:
    name: str
    artifact_digest: str
    artifact_size: int
    format: str
    source: str | None
    aliases: tuple[str, ...]
    created_at: float
    origin: dict[str, Any] | None = None  # repo, revision, commit, files (model pull)
    kind: str = "completion"  # what proves its engine: a completion or an embedding
    # An OpenAI-compatible upstream instead of placement groups (format
    # "external"): url, provider_model, key_file, ca_file, concurrency. The
    # provider's key is never here, only the file it is read from.
    external: dict[str, Any] | None = None
    fallback: str | None = None  # the model that answers when this one cannot

    @property
    def is_external(self) -> bool:
        return self.external is not None

    @property
    def external_stopped(self) -> bool:
        """An external model an administrator stopped (`model stop`)."""
        return self.external is not None and self.external.get("desired") == "stopped"


@dataclass(frozen=True)
class PlacementGroupRecord:
    id: str
    service: str
    node_id: str
    release_id: str
    target: str
    desired: str
    state: str
    endpoint: str | None
    pid: int | None
    capacity: int | None
    restarts: int
    detail: str | None
    created_at: float
    updated_at: float
    paused_reason: str | None = None  # set when a data link its plan needs was lost
    # Raised to make the group's agent start its engine afresh; the observation
    # (state, endpoint...) belongs to observed_generation.
    generation: int = 0
    observed_generation: int | None = None
    # Other weights than its model's (sha256), while an update rolls out (None: its model's).
    artifact_digest: str | None = None


@dataclass(frozen=True)
class ReleaseHistoryRecord:
    """One release a group ran (kept after the group is gone)."""

    seq: int
    service: str
    node_id: str
    pg_id: str
    release_id: str
    event: str  # installed, upgraded, restored, rolled back
    at: float


@dataclass(frozen=True)
class TaskSpec:
    """One task of a placement group as install decides it."""

    task: str  # "0" is the head; it serves the group's endpoint
    node_id: str
    address: str | None = None  # the node's data address (parallel groups)
    port: int | None = None  # fixed for parallel groups; None: the agent picks one
    gpu_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class PgTaskRecord:
    pg_id: str
    task: str
    node_id: str
    address: str | None
    port: int | None
    state: str
    detail: str | None
    updated_at: float


@dataclass(frozen=True)
class GpuClaim:
    """One GPU a placement group's task holds."""

    gpu_uuid: str
    pg_id: str
    node_id: str
    task: str


@dataclass(frozen=True)
class LinkRecord:
    node_a: str  # node_a < node_b
    node_b: str
    state: str  # proven, lost
    changed_at: float


@dataclass(frozen=True)
class ApiKeyRecord:
    id: str
    name: str
    digest: str
    prefix: str
    models: tuple[str, ...]
    concurrency: int | None
    created_at: float
    revoked_at: float | None
    band: str = "standard"  # interactive, standard or batch: its turn in the admission queue
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens (prompt + completion) per minute
    budget_tokens: int | None = None  # tokens per budget_period
    budget_period: str | None = None  # day, week or month (UTC calendar)
    cache_ttl_s: int | None = None  # None: no response cache for this key
    cache_sampled: bool = False  # also cache answers sampled at a non-zero temperature
    owner: str | None = None  # the portal account that made it (its keys stop when it does)
    project: str | None = None  # its project: the project's models and limits bound it


@dataclass(frozen=True)
class ArtifactReference:
    digest: str  # sha256 hex, as the holder records it
    holder_kind: str  # "model service" or "runtime release"
    holder: str  # its name or id


def _node(r: dict[str, Any]) -> NodeRecord:
    return NodeRecord(
        id=r["id"],
        name=r["name"],
        role=r["role"],
        address=r["address"],
        state=r["state"],
        paused=bool(r["paused"]),
        created_at=r["created_at"],
        cert_fingerprint=r["cert_fingerprint"],
        last_seen=r["last_seen"],
        facts=json.loads(r["facts"]) if r.get("facts") else None,
        facts_at=r.get("facts_at"),
        removed_at=r.get("removed_at"),
        facts_seq=r.get("facts_seq"),
        audit_head=json.loads(r["audit_head"]) if r.get("audit_head") else None,
        audit_problem=r.get("audit_problem"),
        cert_not_after=r.get("cert_not_after"),
    )


def _service(r: dict[str, Any]) -> ServiceRecord:
    return ServiceRecord(
        name=r["name"],
        artifact_digest=r["artifact_digest"],
        artifact_size=r["artifact_size"],
        format=r["format"],
        source=r["source"],
        aliases=tuple(json.loads(r["aliases"])),
        created_at=r["created_at"],
        origin=json.loads(r["origin"]) if r.get("origin") else None,
        kind=r.get("kind") or "completion",
        external=json.loads(r["external"]) if r.get("external") else None,
        fallback=r.get("fallback"),
    )


def _pg(r: dict[str, Any]) -> PlacementGroupRecord:
    return PlacementGroupRecord(**r)


def _key(r: dict[str, Any]) -> ApiKeyRecord:
    return ApiKeyRecord(
        id=r["id"],
        name=r["name"],
        digest=r["digest"],
        prefix=r["prefix"],
        models=tuple(json.loads(r["models"])),
        concurrency=r["concurrency"],
        created_at=r["created_at"],
        revoked_at=r["revoked_at"],
        band=r.get("band") or "standard",
        rpm=r.get("rpm"),
        tpm=r.get("tpm"),
        budget_tokens=r.get("budget_tokens"),
        budget_period=r.get("budget_period"),
        cache_ttl_s=r.get("cache_ttl_s"),
        cache_sampled=bool(r.get("cache_sampled")),
        owner=r.get("owner"),
        project=r.get("project"),
    )
