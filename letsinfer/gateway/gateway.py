"""The gateway's parts, wired together once from its settings."""

from __future__ import annotations

from dataclasses import dataclass

from letsinfer.authority.denials import DenialLog
from letsinfer.config import GatewaySettings
from letsinfer.gateway.admission import Admission, AdmissionLimits
from letsinfer.gateway.directory import Directory
from letsinfer.gateway.engine_client import EngineClient
from letsinfer.gateway.metrics import GatewayMetrics
from letsinfer.gateway.policy import RoutingPolicy
from letsinfer.gateway.routing import RoutingTable
from letsinfer.gateway.upstream import Upstream
from letsinfer.usage.recorder import RequestLog


@dataclass
class Gateway:
    directory: Directory
    routing: RoutingTable
    policy: RoutingPolicy
    admission: Admission
    metrics: GatewayMetrics
    upstream: Upstream
    max_body_bytes: int
    denials: DenialLog  # refused keys, counted (written by the node's background task)
    records: RequestLog | None = None  # per-request records (written in the background)

    @classmethod
    def build(
        cls,
        directory: Directory,
        routing: RoutingTable,
        settings: GatewaySettings | None = None,
        denials: DenialLog | None = None,
        records: RequestLog | None = None,
    ) -> Gateway:
        s = settings or GatewaySettings()
        policy = RoutingPolicy(
            affinity_prefix_chars=s.affinity_prefix_chars,
            affinity_min_chars=s.affinity_min_chars,
            load_bound=s.affinity_load_bound,
            fact_max_age_s=s.fact_max_age_s,
        )
        admission = Admission(
            routing, policy, AdmissionLimits(s.queue_max_waiting, s.queue_max_wait_s)
        )
        metrics = GatewayMetrics(routing, admission)
        client = EngineClient(s.upstream_connect_timeout_s, s.upstream_timeout_s)
        return cls(
            directory=directory,
            routing=routing,
            policy=policy,
            admission=admission,
            metrics=metrics,
            upstream=Upstream(client, admission, metrics),
            max_body_bytes=s.max_body_bytes,
            denials=denials or DenialLog(directory.store),
            records=records,
        )

    async def aclose(self) -> None:
        await self.upstream.aclose()
