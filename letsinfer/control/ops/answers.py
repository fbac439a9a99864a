"""The admin API's answer shapes, shared by its routes and its OpenAPI
document. ``extra="allow"``: an answer may carry more than is listed (a newer
main says more; the CLI reads what it knows). Fields are declared in the
order the CLI on the main prints them: `--json` output is the same, byte for
byte, from a controller."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class StateNode(Answer):
    id: str
    name: str
    role: str
    state: str
    paused: bool
    last_seen: float | None


class StateModel(Answer):
    name: str
    aliases: list[str]


class StateGroup(Answer):
    id: str
    model: str
    node: str
    desired: str
    state: str


class StateAnswer(Answer):
    nodes: list[StateNode]
    models: list[StateModel]
    placement_groups: list[StateGroup]


class NodeShown(Answer):
    """A node as `node list --json` shows it (docs/json.md)."""

    name: str
    id: str
    role: str
    address: str | None
    state: str
    paused: bool
    last_seen: str | None
    removed_at: str | None
    fingerprint: str | None


class ModelShown(Answer):
    """A model as `model list --json` shows it (docs/json.md; more fields
    than are listed here)."""

    name: str
    aliases: list[str]
    kind: str
    format: str | None


class VersionAnswer(Answer):
    version: str
    main: str


class DesiredAnswer(Answer):
    model: str
    desired: str
    placement_groups: int
    unparked: list[str]


class ResumeAnswer(Answer):
    model: str
    placement_groups: Any
    unpaused: Any


class StartAnswer(DesiredAnswer):
    downloads: Any = None


class FallbackAnswer(Answer):
    model: str
    fallback: str | None
    notes: list[str]


class ScaleAnswer(Answer):
    model: str
    policy: dict[str, Any]
    summary: str


class KeyCreated(Answer):
    name: str
    key: str
    models: list[str]
    concurrency: int | None
    band: str
    rpm: int | None
    tpm: int | None
    budget_tokens: int | None
    budget_period: str | None
    cache_ttl_s: int | None
    cache_sampled: bool
    succeeds_revoked: int | None = None


class KeyLimits(Answer):
    name: str
    band: str
    rpm: int | None
    tpm: int | None
    budget_tokens: int | None
    budget_period: str | None
    cache_ttl_s: int | None
    cache_sampled: bool


class KeyListed(Answer):
    name: str
    prefix: str
    models: list[str]
    concurrency: int | None
    band: str
    rpm: int | None
    tpm: int | None
    budget_tokens: int | None
    budget_period: str | None
    cache_ttl_s: int | None
    cache_sampled: bool
    created: str | None
    revoked: str | None


class KeyRevoked(Answer):
    name: str
    revoked: bool


class NodePaused(Answer):
    node: str
    paused: bool


class GroupOutcome(Answer):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    group: str
    node: str
    from_: str | None = Field(None, alias="from")
    to: str | None = None
    outcome: str
    detail: str | None = None
    now: str


class RolloutAnswer(Answer):
    model: str
    action: str
    ok: bool
    placement_groups: list[GroupOutcome]


class UsageRow(Answer):
    """One row of `letsinfer usage --json`: ``key``, ``model``, ``node`` or
    ``tag`` (whichever was asked for; the others are absent) and the sums."""

    key: str | None = None
    model: str | None = None
    node: str | None = None
    tag: str | None = None
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class RequestRecord(Answer):
    """One row of `letsinfer request ID --json` (never the request's text)."""

    request_id: str
    time: str
    key: str | None
    model: str | None
    placement_group: str | None
    node: str | None
    endpoint: str | None
    stream: bool | None
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    cached: bool | None
    charged_tokens: int | None
    tags: list[str] = []
    ttft_ms: float | None
    duration_ms: float
    queue_ms: float


class AuditVerified(Answer):
    """What `letsinfer audit verify` checks: ``problems`` empty when intact."""

    records: int
    head: int | None
    unanchored: int
    problems: list[str]


class DenialRecorded(Answer):
    recorded: bool
