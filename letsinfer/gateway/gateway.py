"""The gateway's parts, wired together once from its settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from letsinfer.authority.denials import DenialLog
from letsinfer.config import ConfigError, GatewaySettings, TracingSettings
from letsinfer.gateway.admission import Admission, AdmissionLimits
from letsinfer.gateway.availability import Availability
from letsinfer.gateway.directory import Directory
from letsinfer.gateway.engine_client import EngineClient
from letsinfer.gateway.metrics import GatewayMetrics
from letsinfer.gateway.policy import RoutingPolicy
from letsinfer.gateway.routing import RoutingTable
from letsinfer.gateway.upstream import Upstream
from letsinfer.usage.recorder import RequestLog

if TYPE_CHECKING:
    from letsinfer.gateway.tracing import Tracing


@dataclass
class Gateway:
    directory: Directory
    routing: RoutingTable
    availability: Availability
    policy: RoutingPolicy
    admission: Admission
    metrics: GatewayMetrics
    upstream: Upstream
    max_body_bytes: int
    denials: DenialLog  # refused keys, counted (written by the node's background task)
    records: RequestLog | None = None  # per-request records (written in the background)
    tracing: Tracing | None = None  # OpenTelemetry, only when configured

    @classmethod
    def build(
        cls,
        directory: Directory,
        routing: RoutingTable,
        settings: GatewaySettings | None = None,
        denials: DenialLog | None = None,
        records: RequestLog | None = None,
        tracing: TracingSettings | None = None,
    ) -> Gateway:
        s = settings or GatewaySettings()
        policy = RoutingPolicy(
            affinity_prefix_chars=s.affinity_prefix_chars,
            affinity_min_chars=s.affinity_min_chars,
            load_bound=s.affinity_load_bound,
            fact_max_age_s=s.fact_max_age_s,
        )
        availability = Availability(directory, routing)
        admission = Admission(
            routing,
            policy,
            AdmissionLimits(s.queue_max_waiting, s.queue_max_wait_s),
            availability.refusal,
        )
        metrics = GatewayMetrics(routing, admission)
        client = EngineClient(s.upstream_connect_timeout_s, s.upstream_timeout_s)
        traces = None
        upstream = Upstream(client, admission, metrics)
        if tracing is not None and tracing.otlp_endpoint is not None:
            try:  # only now: a gateway without tracing never loads OpenTelemetry's SDK
                from letsinfer.gateway.tracing import TracedUpstream, Tracing
            except ImportError as exc:
                raise ConfigError(
                    f"tracing.otlp_endpoint is set, but OpenTelemetry is not installed ({exc}); "
                    "install it with: pip install 'letsinfer[tracing]'"
                ) from exc
            traces = Tracing(tracing)
            upstream = TracedUpstream(client, admission, metrics, tracing=traces)
        return cls(
            directory=directory,
            routing=routing,
            availability=availability,
            policy=policy,
            admission=admission,
            metrics=metrics,
            upstream=upstream,
            max_body_bytes=s.max_body_bytes,
            denials=denials or DenialLog(directory.store),
            records=records,
            tracing=traces,
        )

    async def aclose(self) -> None:
        await self.upstream.aclose()
        if self.tracing is not None:
            await self.tracing.shutdown()
