"""Node settings: ``config.toml`` under the home, then environment overrides.

Environment variables are ``LETSINFER_<SECTION>__<KEY>`` (for example
``LETSINFER_GATEWAY__PORT=8001``). Loading is the only place that does I/O;
the models below are plain data. An invalid setting stops the node at start
with the key and the reason.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

ENV_PREFIX = "LETSINFER_"


class ConfigError(Exception):
    """A setting is missing, unknown or out of range; the message names it."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _split_networks(value: object) -> object:
    # From an environment variable the list arrives as one string.
    if isinstance(value, str):
        return tuple(part for part in re.split(r"[,\s]+", value) if part)
    return value


def _checked_networks(value: tuple[str, ...]) -> tuple[str, ...]:
    for network in value:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ValueError(f"{network!r} is not a network (such as 10.0.0.0/8)") from None
    return value


# A list of CIDRs (metrics sources, networks fetches may reach).
Networks = Annotated[
    tuple[str, ...], BeforeValidator(_split_networks), AfterValidator(_checked_networks)
]


class GatewaySettings(_Section):
    host: str = "0.0.0.0"
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    # The most of an engine's or provider's whole (not streamed) answer kept
    # in memory to relay it: a larger one is refused with 502.
    max_answer_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024)
    upstream_connect_timeout_s: float = Field(5.0, gt=0)
    upstream_timeout_s: float = Field(600.0, gt=0)
    key_cache_ttl_s: float = Field(2.0, gt=0, le=60)
    # Admission: when every replica of a model is full, requests wait (fairly
    # across API keys) in one queue of at most this many, for at most this long.
    queue_max_waiting: int = Field(1024, ge=0)
    queue_max_wait_s: float = Field(30.0, gt=0)
    # Prefix affinity: the first N characters of a prompt pick a replica whose
    # prompt cache likely holds them (0 turns it off); prompts shorter than the
    # minimum carry no hint; no replica takes more than load_bound times its share.
    affinity_prefix_chars: int = Field(256, ge=0)
    affinity_min_chars: int = Field(32, ge=1)
    affinity_load_bound: float = Field(1.25, ge=1.0)
    # A replica whose reported facts are older than this is never chosen.
    fact_max_age_s: float = Field(10.0, gt=0)
    # The response cache of keys that have one (`auth key limits --cache-ttl`):
    # in memory, at most this many bytes of answers (least recently used go first).
    cache_max_bytes: int = Field(64 * 1024 * 1024, ge=0)
    # Connections: at most max_connections open at once (fewer when the file
    # limit is low; new ones then wait in the kernel's queue), at most
    # max_connections_per_client of them from one address (more are closed at
    # once). A client must finish a request's headers within header_timeout_s
    # of connecting (or of its first byte on a kept-alive connection); a
    # kept-alive connection with no request for idle_timeout_s is closed.
    max_connections: int = Field(10_000, ge=1)
    max_connections_per_client: int = Field(1_000, ge=1)
    header_timeout_s: float = Field(10.0, gt=0, le=300)
    idle_timeout_s: float = Field(5.0, gt=0, le=3600)
    # When the node stops or restarts, the gateway stops accepting at once and
    # lets requests in flight (streams too) finish for up to this long.
    drain_timeout_s: float = Field(30.0, ge=0, le=3600)
    # Prometheus metrics on their own port (0 disables), loopback only unless
    # metrics_host exposes them: then only loopback and the networks in
    # metrics_allow get an answer (the node closes any other connection; the
    # firewall role keeps them out too).
    metrics_port: int = Field(9400, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    metrics_allow: Networks = ()

    @field_validator("metrics_host")
    @classmethod
    def _metrics_host(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address of this machine") from None
        return value

    @model_validator(mode="after")
    def _metrics_exposure(self) -> GatewaySettings:
        loopback = ipaddress.ip_address(self.metrics_host).is_loopback
        if not loopback and not self.metrics_allow:
            raise ValueError(
                f"metrics_host {self.metrics_host} exposes metrics beyond this machine: "
                'list the networks that may read them in metrics_allow (e.g. ["10.0.0.5/32"])'
            )
        if loopback and self.metrics_allow:
            raise ValueError(
                f"metrics_allow has no effect while metrics_host is {self.metrics_host} "
                "(loopback): set metrics_host to an address other hosts reach"
            )
        return self


class EngineSettings(_Section):
    kind: Literal["xllamacpp", "llama-server"] = "xllamacpp"
    llama_server_binary: str = "llama-server"
    threads: int = Field(default_factory=lambda: max(1, min(os.cpu_count() or 1, 8)), ge=1)
    context: int = Field(4096, ge=256)
    parallel: int = Field(4, ge=1, le=256)
    ready_timeout_s: float = Field(120.0, gt=0)
    # Parallel runtimes (``model install --parallel``): vLLM over Ray on cuda
    # targets; on cpu targets a parallel-command launcher, if one is configured.
    vllm_version: str = "0.34.0"  # the flags engines/vllm.py plans are this release's
    parallel_command: str | None = None
    # Ports the main hands to the tasks of parallel groups, per node.
    task_port_first: int = Field(20000, ge=1024, le=65535)
    task_port_last: int = Field(20999, ge=1024, le=65535)
    # Ports engines listen on: a child's on its data address, which the firewall
    # role lets only the main reach; the main's own on loopback.
    port_first: int = Field(21000, ge=1024, le=65535)
    port_last: int = Field(29999, ge=1024, le=65535)

    @model_validator(mode="after")
    def _port_ranges(self) -> EngineSettings:
        for name, first, last in (
            ("task_port", self.task_port_first, self.task_port_last),
            ("port", self.port_first, self.port_last),
        ):
            if first > last:
                raise ValueError(f"{name}_first ({first}) is above {name}_last ({last})")
        if self.port_first <= self.task_port_last and self.task_port_first <= self.port_last:
            raise ValueError(
                f"engine ports {self.port_first}-{self.port_last} overlap task ports "
                f"{self.task_port_first}-{self.task_port_last}"
            )
        return self


class ControlSettings(_Section):
    """The main's mutual-TLS control plane: enrolled nodes and paired controllers."""

    host: str = "0.0.0.0"
    port: int = Field(8443, ge=1, le=65535)
    advertise: str | None = None  # address children use for the main; default: host
    enrollment_ttl_s: float = Field(900.0, gt=0)
    pairing_code_ttl_s: float = Field(600.0, gt=0)
    # Directories on the main, beside its model store and mirror, whose files a
    # controller may add (`model add --gguf`, `model adapter add`): nothing
    # else on the main is opened, or even looked for, for a controller.
    add_from: tuple[str, ...] = ()
    heartbeat_interval_s: float = Field(5.0, gt=0)
    node_stale_after_s: float = Field(20.0, gt=0)
    # A node certificate (30 days) is renewed this long before it expires.
    renew_certificates_before_s: float = Field(10 * 24 * 3600, gt=0)
    # Every node keeps one connection open to the control plane (its reports
    # reuse it): room for them all, and a share per source address. Lowered
    # to fit under the open-file limit, like the gateway's.
    max_connections: int = Field(4096, ge=16, le=1_000_000)
    max_connections_per_client: int = Field(64, ge=1)
    # Nodes' facts are written in batches: one transaction per this interval
    # for every node that reported meanwhile (a report is answered once its
    # batch is on disk).
    facts_batch_interval_s: float = Field(0.1, gt=0, le=5)
    # Tests and benchmarks of overload only: each report's facts cost this many
    # more seconds to write, inside their batch's transaction.
    report_cost_s: float = Field(0.0, ge=0, le=10)

    @field_validator("add_from")
    @classmethod
    def _absolute_dirs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not Path(path).is_absolute():
                raise ValueError(f"{path!r} is not an absolute path")
        return value


class HardwareSettings(_Section):
    fake_gpus: str | None = None  # a JSON file describing GPUs (tests, labs)


class DiscoverySettings(_Section):
    enabled: bool = True


class AgentSettings(_Section):
    api_host: str = "0.0.0.0"
    api_port: int = Field(8444, ge=1, le=65535)
    advertise: str | None = None  # address the main uses for this agent; default: api_host
    restart_backoff_initial_s: float = Field(0.5, gt=0)
    restart_backoff_max_s: float = Field(30.0, gt=0)
    health_interval_s: float = Field(2.0, gt=0)
    reconcile_interval_s: float = Field(1.0, gt=0)
    # Engines outlive a restart of the node's letsinfer process and are adopted
    # again; one that no node re-adopts within this many seconds (the node was
    # killed, or stopped for good) stops by itself.
    orphan_grace_s: float = Field(60.0, ge=2, le=3600)
    # An engine that fails to start (never healthy and proven) this many times
    # in a row is parked: not restarted until `model start`; 0 never parks.
    park_after_failed_starts: int = Field(5, ge=0)


class RequestSettings(_Section):
    """Per-request records (id, key name, model, group, status, tokens, times;
    never text) in their own database beside the authority's, written in
    batches off the request path; `letsinfer request` and `letsinfer usage`."""

    enabled: bool = True
    keep_days: int = Field(90, ge=1, le=3650)  # older records are deleted
    flush_interval_s: float = Field(1.0, gt=0, le=60)
    # Records waiting for the writer; beyond this (a stuck disk) new ones are
    # counted as dropped, never held without bound.
    max_pending: int = Field(100_000, ge=100)


class TracingSettings(_Section):
    """OpenTelemetry traces of the gateway's requests, off unless an OTLP/HTTP
    endpoint is set (needs the ``tracing`` extra: pip install 'letsinfer[tracing]').
    Spans go to ``<otlp_endpoint>/v1/traces``; engines get a ``traceparent``."""

    otlp_endpoint: str | None = None  # e.g. "http://collector.lan:4318"
    service_name: str = Field("letsinfer-gateway", min_length=1, max_length=128)
    sample_ratio: float = Field(1.0, ge=0, le=1)  # of requests without a sampled parent

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError(f"{value!r} is not an http(s) URL (such as http://collector:4318)")
        return value.rstrip("/")


class AuditSettings(_Section):
    """Refusals without credentials (bad certificate, bad key, scope) are
    recorded as one audit record per source, reason and interval, with a count."""

    denial_interval_s: float = Field(60.0, ge=1, le=86400)


class LinkSettings(_Section):
    """Data links between the nodes of a parallel group, proven by their agents."""

    probe_interval_s: float = Field(5.0, gt=0)
    probe_timeout_s: float = Field(3.0, gt=0)
    proof_ttl_s: float = Field(30.0, gt=0)  # a proof older than this proves nothing


class LifecycleSettings(_Section):
    """Changes to running groups (upgrade, rollback, replace, cluster stop/restart)."""

    # A group leaving service admits nothing new and waits this long at most
    # for its requests in flight to finish.
    drain_timeout_s: float = Field(600.0, gt=0)
    # A new or restarted group must be ready (healthy and proven) or parked
    # within this; otherwise the change counts as failed.
    start_timeout_s: float = Field(900.0, gt=0)


class CapacitySettings(_Section):
    """Loads on demand, idle unloads, eviction and replica counts (docs/capacity.md).
    Each model's own policy is `letsinfer model scale`; these are the main's."""

    # How often idle times and loads are looked at.
    interval_s: float = Field(1.0, gt=0, le=60)
    # A load not serving by then fails the requests waiting for it (503).
    load_timeout_s: float = Field(300.0, gt=0)
    # After an eviction, how long the planner gets to see the room it made
    # (fresh facts) before another group is evicted for the same load.
    settle_s: float = Field(3.0, ge=0, le=120)
    # Requests above a model's target (or waiting) this long add a group.
    scale_up_after_s: float = Field(3.0, ge=0)
    # A group scaled down waits this long at most for its requests.
    drain_timeout_s: float = Field(120.0, gt=0)
    # Which idle group goes first: "cost" (cheapest to load again, weighed by
    # recent use) or "lru" (least recently used: the usual cache's rule, kept
    # as the baseline benchmarks/capacity.py measures against).
    eviction: Literal["cost", "lru"] = "cost"
    # A request for a model that is out defers to the models resident while
    # its model is asked for less than the one that would go; at most this
    # long: then its load takes a group past its minimum residence (one busy
    # is drained first). Keep it below [gateway] queue_max_wait_s.
    max_defer_s: float = Field(5.0, ge=0, le=600)


class WebhookSettings(_Section):
    """Deliveries of signed webhooks (docs/webhooks.md): how often the main
    looks for events and due deliveries, and how a failed one is retried."""

    interval_s: float = Field(1.0, gt=0, le=60)
    # The first retry waits about this long; each next one twice as long
    # (with jitter), up to retry_max_s; after max_attempts it is given up.
    retry_base_s: float = Field(5.0, gt=0, le=3600)
    retry_max_s: float = Field(3600.0, gt=0)
    max_attempts: int = Field(12, ge=1, le=100)
    # One attempt's wait for the endpoint's answer.
    timeout_s: float = Field(10.0, gt=0, le=120)
    # Finished deliveries kept per endpoint (`webhook deliveries URL`).
    keep_deliveries: int = Field(1000, ge=10, le=100_000)


class PortalSettings(_Section):
    """The portal's pages under /ui/ on the gateway (docs/portal.md)."""

    enabled: bool = True
    session_ttl_s: float = Field(8 * 3600.0, gt=0, le=30 * 86400)
    # Guessing is bounded per account: this many failed sign-ins within the
    # window, and the account's sign-in answers 429 until the oldest leaves it.
    signin_failures: int = Field(10, ge=1, le=1000)
    signin_window_s: float = Field(900.0, gt=0, le=86400)


_RELEASE_PUBLIC_KEY = re.compile(r"ed25519:[A-Za-z0-9+/]{43}=")


class ReleaseSettings(_Section):
    # Public keys (`letsinfer release keygen` prints them) whose signatures this
    # node accepts on bundles and runtime releases.
    trusted_keys: tuple[str, ...] = ()

    @field_validator("trusted_keys", mode="before")
    @classmethod
    def _split_env_value(cls, value: object) -> object:
        # From LETSINFER_RELEASE__TRUSTED_KEYS the list arrives as one string.
        if isinstance(value, str):
            return tuple(part for part in re.split(r"[,\s]+", value) if part)
        return value

    @field_validator("trusted_keys")
    @classmethod
    def _public_keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for key in value:
            if not _RELEASE_PUBLIC_KEY.fullmatch(key):
                raise ValueError(f"{key!r} is not a release public key (ed25519:<base64>)")
        return value


class HubSettings(_Section):
    """Where `model pull` finds models: a Hugging Face-compatible hub (a site may
    point this at its own mirror of one), and the node's mirror when the hub is
    off or out of reach."""

    enabled: bool = True  # false: pull only from this node's mirror
    endpoint: str = "https://huggingface.co"
    # A file holding an access token (gated or private repositories). The token
    # never appears on a command line, in the config itself or in any log.
    token_file: str | None = None
    timeout_s: float = Field(10.0, gt=0, le=600)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError(f"{value!r} is not an http(s) URL (such as https://hub.example.org)")
        return value.rstrip("/")

    @field_validator("token_file")
    @classmethod
    def _token_file(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_absolute():
            raise ValueError(f"{value!r} is not an absolute path")
        return value


class FetchSettings(_Section):
    """URLs an operator gives (mirrors, hub, providers, webhooks) reach only
    global addresses: loopback, private, link-local (the cloud metadata
    service), CGNAT and other non-global addresses are refused unless their
    network is listed here (docs/safe-fetching.md). ``proxy``: the HTTP proxy
    those fetches go through (empty: HTTPS_PROXY/HTTP_PROXY/NO_PROXY from the
    environment, if set)."""

    allow_networks: Networks = ()  # e.g. ["10.0.0.0/8", "127.0.0.1/32"]
    proxy: str = ""  # e.g. "http://proxy.lan:3128"

    @field_validator("proxy")
    @classmethod
    def _proxy(cls, value: str) -> str:
        if value and not re.fullmatch(r"https?://([^\s/?#@]+@)?[^\s/?#@]+/?", value):
            raise ValueError(
                f"{value!r} is not an http(s) proxy URL (such as http://proxy.lan:3128)"
            )
        return value


class Settings(_Section):
    gateway: GatewaySettings = GatewaySettings()
    engine: EngineSettings = EngineSettings()
    agent: AgentSettings = AgentSettings()
    links: LinkSettings = LinkSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    capacity: CapacitySettings = CapacitySettings()
    control: ControlSettings = ControlSettings()
    discovery: DiscoverySettings = DiscoverySettings()
    release: ReleaseSettings = ReleaseSettings()
    hardware: HardwareSettings = HardwareSettings()
    hub: HubSettings = HubSettings()
    fetch: FetchSettings = FetchSettings()
    audit: AuditSettings = AuditSettings()
    requests: RequestSettings = RequestSettings()
    tracing: TracingSettings = TracingSettings()
    webhooks: WebhookSettings = WebhookSettings()
    portal: PortalSettings = PortalSettings()

    @model_validator(mode="after")
    def _facts_outlive_a_heartbeat(self) -> Settings:
        # Facts arrive every heartbeat; older than fact_max_age_s a replica is
        # not chosen, so a shorter age would leave every replica unroutable.
        age, beat = self.gateway.fact_max_age_s, self.control.heartbeat_interval_s
        if age <= beat:
            raise ValueError(
                f"gateway.fact_max_age_s ({age:g}) must be longer than "
                f"control.heartbeat_interval_s ({beat:g}): facts arrive once per heartbeat"
            )
        return self


def _env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
        out.setdefault(section, {})[key] = value
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in extra.items():
        target = merged.setdefault(section, {})
        if isinstance(target, dict):
            target.update(values)
        else:
            merged[section] = dict(values)
    return merged


def _describe(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "settings"
        reason = "unknown setting" if item["type"] == "extra_forbidden" else item["msg"]
        lines.append(f"  {key}: {reason} (got {item.get('input')!r})")
    return "\n".join(lines)


def load(
    config_file: Path,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Settings:
    """Read ``config_file`` (absent is fine), apply env, then explicit overrides."""
    raw: dict[str, Any] = {}
    if config_file.exists():
        try:
            raw = tomllib.loads(config_file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid configuration ({config_file}): {exc}") from exc
    raw = _merge(raw, _env_overrides(os.environ if environ is None else environ))
    raw = _merge(raw, overrides or {})
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, f"{config_file} and {ENV_PREFIX}* variables")) from exc
