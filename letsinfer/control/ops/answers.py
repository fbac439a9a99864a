"""The admin API's answer shapes, shared by its routes and its OpenAPI
document. ``extra="allow"``: an answer may carry more than is listed (a newer
main says more; the CLI reads what it knows). Fields are declared in the
order the CLI on the main prints them: `--json` output is the same, byte for
byte, from a controller."""

from typing import Any, Literal

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


class NodeGroups(NodeShown):
    placement_groups: list[dict[str, Any]]


class TopologyNode(NodeShown):
    """A node as `topology --json` shows it: its GPUs, groups and data links."""

    targets: list[str]
    gpus: list[dict[str, Any]]
    placement_groups: list[dict[str, Any]]
    links: list[dict[str, Any]]


class ClusterShown(Answer):
    """`cluster status --json`: ``groups``, when stopped, are those `cluster
    start` restores."""

    stopped: bool
    stopped_at: str | None
    groups: list[str]
    nodes: list[NodeGroups]


class ReleaseShown(Answer):
    """A runtime release as `release list --json` shows it."""

    id: str
    engine: str
    version: str | None
    target: str
    binary: str | None
    sha256: str | None
    signed: bool
    placement_groups: list[dict[str, str]]


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
    # The main's [lifecycle] start_timeout_s: how long `model start --wait` waits.
    start_timeout_s: float | None = None


class SaidLine(Answer):
    """One line an operation said (rich markup), to print as the main's CLI did."""

    to: Literal["out", "err"]
    text: str
    highlight: bool | None = None
    soft_wrap: bool | None = None


class AdmissionAnswer(Answer):
    """`model pull` and `model add`: the model added (null: it was there
    already, nothing changed) and what the operation said, in order."""

    model: str | None
    said: list[SaidLine]


class FallbackAnswer(Answer):
    model: str
    fallback: str | None
    notes: list[str]


class ScaleAnswer(Answer):
    model: str
    policy: dict[str, Any]
    summary: str


class GateAnswer(Answer):
    """A model's gate as `model gate --json` shows it; ``cleared``: whether a
    clear removed one (null: no clear was asked)."""

    model: str
    suite: str | None
    min_score: float | None
    set_at: str | None
    cleared: bool | None = None


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


class NodeInfo(Answer):
    """`node info`: the node's name and what its agent said (`--json` prints ``info``)."""

    node: str
    info: dict[str, Any]


class NodeRemoved(Answer):
    """What `node remove --json` prints: the node, the placement groups that
    went with it, and what the node was told."""

    node: str
    node_id: str
    address: str | None
    placement_groups: list[dict[str, Any]]
    told: bool
    engines_stopped: int | None
    notice: str


class ModelRemoved(Answer):
    model: str
    placement_groups: list[str]
    freed: str | None
    shared: list[str]
    adapters: list[str]
    fallbacks_cleared: list[str]
    keys_narrowed: list[str]
    cut: int = Field(description="requests cut short by the drain (with stop)")


class ClusterStopped(Answer):
    stopped: list[str]
    cut: int
    still_running: list[str]


class ClusterStarted(Answer):
    started: list[str]
    placement_groups: dict[str, str]  # group -> how it came back
    ok: bool


class NodeRestarted(Answer):
    node: str
    placement_groups: dict[str, str]


class ClusterRestarted(Answer):
    ok: bool
    nodes: list[NodeRestarted]
    dark: list[str]


class EvalRunListed(Answer):
    run: str
    started: str
    model: str
    group: str | None
    suite: str
    cases: int
    score: int | float  # (as stored: a JSON 1 stays 1)
    threshold: int | float
    passed: bool


class EvalRunShown(EvalRunListed):
    source: str


class EvalCaseShown(Answer):
    case: int
    name: str
    scorer: str
    weight: int | float
    score: int | float
    note: str | None
    request_id: str | None
    status: int | None
    answer: str | None
    duration_ms: int | float


class EvalRunDetail(Answer):
    run: EvalRunShown
    cases: list[EvalCaseShown]


class EvalRunDone(EvalRunListed):
    cases: list[EvalCaseShown]  # type: ignore[assignment]  # (here, the cases themselves)


class EvalRunAnswer(Answer):
    """`eval run` from a controller: what the run said, and the run as
    `eval run --json` prints it."""

    said: list[SaidLine]
    run: EvalRunDone


class ControllerListed(Answer):
    name: str
    id: str
    role: str
    state: str


class ControllerAdded(Answer):
    """`auth controller add`: the one-time pairing code, its comparison
    string and how long it is valid."""

    name: str
    role: str
    code: str
    comparison: str
    ttl_s: float


class ControllerRevoked(Answer):
    name: str
    id: str
    revoked: bool


class PlanRow(Answer):
    node: str
    fits: bool
    target: str | None
    gpus: list[str]
    release: str | None
    needs: dict[str, Any] | None
    replaces: Any
    reason: str | None


class PlanAnswer(Answer):
    """`model plan`: ``nodes`` is what `model plan --json` prints; ``fits``,
    what each placement needs, as its text output says it."""

    model: str
    nodes: list[PlanRow]
    fits: dict[str, str]


class AdapterListed(Answer):
    name: str
    model: str
    sha256: str
    size: int
    added: str
    fallback: str | None


class AdapterChanged(Answer):
    """An adapter added or removed, and its model's groups loading the
    adapters again (``reload``; null: no gateway runs, they load them when
    they start)."""

    adapter: str
    model: str
    sha256: str
    narrowed: list[str]  # API keys whose model lists named it (removed)
    reload: dict[str, Any] | None


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


class ExposureShown(Answer):
    """`exposure status --json` (docs/exposure.md): more fields when published."""

    published: bool


class ExposureEnabled(Answer):
    """`exposure enable`: what is published and the certificate served
    (ca_file: clients trust it, with the cluster CA's)."""

    url: str
    sources: list[str]
    certificate: dict[str, Any]
    ca_file: str | None
    node_serving: bool
    plain: str
    plain_changes: bool
    firewall: str


class ExposureDisabled(Answer):
    """`exposure disable` (closed: false, nothing was published)."""

    closed: bool
    node_running: bool
    plain_returns: bool
    firewall: str


class JoinCodeIssued(Answer):
    """`node add --code --json`: the one-time join code and the command
    that uses it on the new machine."""

    code: str
    id: str
    ca_fingerprint: str
    expires_at: float
    join: str


class UpdateAnswer(Answer):
    """`model update` from a controller: what the download said, the commit
    it resolved to, the new weights (sha256 null: the model runs them
    already, nothing changed) and their rollout (null then)."""

    said: list[SaidLine]
    model: str
    repo: str
    commit: str
    sha256: str | None
    rollout: RolloutAnswer | None


class ReleaseAdded(Answer):
    """`release add`: the release (existed: recorded before, nothing changed)."""

    release: str
    existed: bool
    binary: str
    sha256: str
    version: str


class MetricsAnswer(Answer):
    """The main's metrics in Prometheus's text format (`letsinfer top`)."""

    text: str


class InstallAnswer(Answer):
    """`model install` from a controller: what the plan said, the groups made
    anew, and the rollout of those it replaced (null: none replaced)."""

    said: list[SaidLine]
    model: str
    created: list[str]
    rollout: RolloutAnswer | None


class CanaryEval(Answer):
    run: str
    suite: str
    group: str
    score: float
    passed: bool
    at: float


class CanaryLatency(Answer):
    p50: float | None
    p95: float | None


class CanarySide(Answer):
    """One side of a canary (`letsinfer model canary --json`): its groups and
    what they answered since it started (errors: status 400 and above)."""

    groups: list[str]
    requests: int
    share: float | None
    errors: int
    error_rate: float | None
    latency_ms: CanaryLatency
    eval: CanaryEval | None


class CanaryAnswer(Answer):
    model: str
    group: str
    percent: float
    kind: str
    change: str
    replaces: str | None
    started_at: float
    started_by: str
    canary: CanarySide
    stable: CanarySide


class ArtifactShown(Answer):
    """A mirror artifact as `mirror list --json` and `mirror unused --json` show it."""

    digest: str
    size: int
    kind: str
    names: list[str]
    bundles: list[str]
    imported_at: str


class WebhookShown(Answer):
    """A webhook as `webhook list --json` shows it."""

    url: str
    events: str
    state: str
    disabled_reason: str | None
    created: str | None


class DeliveryShown(Answer):
    """One delivery as `webhook deliveries --json` shows it."""

    id: str
    event: str
    state: str
    attempts: int
    last_status: str | None
    next_try: str | None
    delivered_at: str | None
    created: str | None


class WebhookRemoved(Answer):
    url: str
    removed: bool


class WebhookAdded(Answer):
    url: str
    events: list[str]


class WebhookTested(Answer):
    """What `webhook test` says: the answer (an HTTP status, or what went
    wrong), whether it was delivered, whether a 410 disabled the webhook."""

    url: str
    status: str
    delivered: bool
    disabled: bool
    delivery: str


class UsageRow(Answer):
    """One row of `letsinfer usage --json`: ``key``, ``model``, ``node``,
    ``tag`` or ``project`` (whichever was asked for; the others are absent)
    and the sums."""

    key: str | None = None
    model: str | None = None
    node: str | None = None
    tag: str | None = None
    project: str | None = None
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
    load_wait_ms: float | None = None


class AuditVerified(Answer):
    """What `letsinfer audit verify` checks: ``problems`` empty when intact."""

    records: int
    head: int | None
    unanchored: int
    problems: list[str]


class DenialRecorded(Answer):
    recorded: bool


class AuditRow(Answer):
    """One record of `letsinfer audit list --json`, oldest first."""

    seq: int
    ts: float
    actor: str
    role: str | None
    action: str
    target: str | None
    outcome: str
    detail: str | None
    prev_hash: str
    hash: str
    count: int | None
    time: str


class DoctorFinding(Answer):
    check: str
    level: Literal["ok", "warn", "fail"]
    message: str
    fix: str


class DoctorReport(Answer):
    """`letsinfer doctor --cluster --json`: ``ok`` false (exit 1) on any failure."""

    host: str
    ok: bool
    failures: int
    warnings: int
    findings: list[DoctorFinding]
