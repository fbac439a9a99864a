"""Prometheus metrics of the gateway, served on their own port: loopback only
unless the operator exposes them, and then only to the networks listed
(``[gateway] metrics_host``, ``metrics_allow``); any other source's
connection is closed as it is accepted.

Per request the gateway only bumps a few counters and two histograms through
cached label children (requests and tokens by model, placement group and API
key name: never a prompt, never key material). Queue depth and in-flight
requests per placement group are read from the admission queue and the routing
table when Prometheus scrapes, so they cost nothing on the request path; the
cluster's own series (groups, nodes, GPUs) come from
letsinfer.telemetry.collector the same way.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Histogram, make_asgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from letsinfer.config import GatewaySettings
from letsinfer.connections import METRICS_LIMITS, GuardedServer, address_filter
from letsinfer.gateway.routing import RoutingTable
from letsinfer.planes import RunningPlane
from letsinfer.telemetry.discovery import with_discovery
from letsinfer.telemetry.view import NodeSample

if TYPE_CHECKING:
    from letsinfer.gateway.admission import Admission

log = logging.getLogger("letsinfer.gateway")

# A finished request: model, status, seconds in all, seconds to the first byte,
# key name, placement group, prompt tokens, completion tokens.
Finished = tuple[str, int, float, float | None, str, str, int | None, int | None]

# Seconds; from sub-millisecond (errors, cached answers) to long generations.
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _LiveCollector(Collector):
    def __init__(self, routing: RoutingTable, admission: Admission) -> None:
        self.routing = routing
        self.admission = admission

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "letsinfer_gateway_queue_depth",
            "Requests waiting in the admission queue for a free replica slot.",
            labels=["model"],
        )
        in_flight = GaugeMetricFamily(
            "letsinfer_gateway_in_flight",
            "Requests the gateway has sent to a placement group and not finished.",
            labels=["model", "pg"],
        )
        capacity = GaugeMetricFamily(
            "letsinfer_gateway_capacity",
            "Requests a placement group may run at once.",
            labels=["model", "pg"],
        )
        parked = GaugeMetricFamily(
            "letsinfer_placement_group_parked",
            "1 for a placement group whose engine kept failing to start and is not "
            "restarted until `letsinfer model start`; reason: the engine's last error.",
            labels=["model", "pg", "reason"],
        )
        for service in self.routing.services():
            depth.add_metric([service], self.admission.depth(service))
            for r in self.routing.replicas(service):
                in_flight.add_metric([service, r.pg_id], r.in_flight)
                capacity.add_metric([service, r.pg_id], r.capacity)
        for service, groups in self.routing.all_parked().items():
            for pg_id, reason in groups.items():
                parked.add_metric([service, pg_id, reason[:200]], 1)
        yield depth
        yield in_flight
        yield capacity
        yield parked


class GatewayMetrics:
    def __init__(self, routing: RoutingTable, admission: Admission) -> None:
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "letsinfer_gateway_requests",
            "Inference requests answered, by model asked and HTTP status.",
            ["model", "status"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "letsinfer_gateway_request_duration_seconds",
            "Time from a request's arrival to its last response byte.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._ttft = Histogram(
            "letsinfer_gateway_time_to_first_token_seconds",
            "Time from a request's arrival to the first response body byte sent.",
            ["model"],
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        )
        self._errors = Counter(
            "letsinfer_gateway_errors",
            "Failed or refused requests and upstream retries, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self._group_tokens = Counter(
            "letsinfer_group_tokens",
            "Tokens a placement group read (prompt) and wrote (completion), from the "
            "engine's usage.",
            ["model", "pg", "kind"],
            registry=self.registry,
        )
        self._key_requests = Counter(
            "letsinfer_key_requests",
            "Inference requests by API key name (authenticated requests only).",
            ["key"],
            registry=self.registry,
        )
        self._key_tokens = Counter(
            "letsinfer_key_tokens",
            "Tokens used by API key name: prompt and completion.",
            ["key", "kind"],
            registry=self.registry,
        )
        self.registry.register(_LiveCollector(routing, admission))
        # Label lookups take a lock and build tuples: cache the children.
        self._children: dict[tuple[str, ...], Any] = {}
        self._counters = {  # by the kind in a child's cache key
            "r": self._requests,
            "k": self._key_requests,
            "g": self._group_tokens,
            "kt": self._key_tokens,
        }

    def _child(self, metric: Any, kind: str, *labels: str) -> Any:
        key = (kind, *labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*labels)
            self._children[key] = child
        return child

    def request(
        self,
        model: str,
        status: int,
        total_s: float,
        ttft_s: float | None,
        *,
        key: str = "-",
        pg: str = "-",
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> None:
        """One finished request. ``key`` and ``pg`` are "-" when there was no
        authenticated key or no placement group (then no series is added)."""
        self.requests([(model, status, total_s, ttft_s, key, pg, prompt_tokens, completion_tokens)])

    def requests(self, finished: Iterable[Finished]) -> None:
        """Finished requests (as :meth:`request` takes them), counted together:
        one increment per series, however many requests it counts."""
        counts: dict[tuple[Any, ...], int] = {}
        latencies: dict[str, list[float]] = {}  # by model
        ttfts: dict[str, list[float]] = {}
        child = self._child
        counted: tuple[Any, ...]
        for model, status, total_s, ttft_s, key, pg, prompt, completion in finished:
            counted = ("r", model, status)
            counts[counted] = counts.get(counted, 0) + 1
            latencies.setdefault(model, []).append(total_s)
            if ttft_s is not None:
                ttfts.setdefault(model, []).append(ttft_s)
            if key != "-":
                counted = ("k", key)
                counts[counted] = counts.get(counted, 0) + 1
            for kind, tokens in (("prompt", prompt), ("completion", completion)):
                if not tokens:
                    continue
                if pg != "-":
                    counted = ("g", model, pg, kind)
                    counts[counted] = counts.get(counted, 0) + tokens
                if key != "-":
                    counted = ("kt", key, kind)
                    counts[counted] = counts.get(counted, 0) + tokens
        for (kind, *labels), n in counts.items():
            if kind == "r":
                labels[1] = str(labels[1])  # the status
            child(self._counters[kind], kind, *labels).inc(n)
        for model, values in latencies.items():
            observe_all(child(self._latency, "l", model), values)
        for model, values in ttfts.items():
            observe_all(child(self._ttft, "t", model), values)

    def error(self, reason: str) -> None:
        self._child(self._errors, "e", reason).inc()


def observe_all(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(v)`` for each of ``values`` (a histogram without
    labels, or a label child), each bucket and the sum counted once:
    ``observe()`` takes two locks per value. This reaches into
    prometheus_client's Histogram, whose bucket counts are kept per bucket
    (made cumulative when collected), a value going to the first bucket whose
    upper bound is at least the value; tests/test_monitoring.py checks the
    result against ``observe()``."""
    if len(values) == 1:
        histogram.observe(values[0])
        return
    per_bucket: dict[int, int] = {}
    bounds = histogram._upper_bounds
    for value in values:
        i = bisect_left(bounds, value)
        per_bucket[i] = per_bucket.get(i, 0) + 1
    buckets = histogram._buckets
    for i, n in per_bucket.items():
        buckets[i].inc(n)
    histogram._sum.inc(sum(values))


def source_filter(allow: tuple[str, ...]) -> Callable[[str], bool]:
    """Which sources may read metrics: loopback, and the ``allow`` networks."""
    return address_filter(allow, loopback=True)


async def start_metrics_server(
    metrics: GatewayMetrics,
    settings: GatewaySettings,
    nodes: Callable[[], Sequence[NodeSample]] | None = None,
) -> RunningPlane | None:
    """Serve metrics on ``settings.metrics_host`` unless the port is 0, on the
    running loop, to loopback and the allowed networks only; with ``nodes``
    (the main's active nodes), Prometheus's HTTP service discovery at ``/sd``
    and each node's target at ``/metrics?node=NAME`` too
    (letsinfer.telemetry.discovery). A busy port disables metrics with an
    error in the log; inference keeps working."""
    host, port = settings.metrics_host, settings.metrics_port
    if port == 0:
        return None
    app = make_asgi_app(registry=metrics.registry)
    config = uvicorn.Config(
        app if nodes is None else with_discovery(app, metrics.registry, nodes),
        host=host,
        port=port,
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    server = GuardedServer(
        config,
        METRICS_LIMITS,
        name="metrics",
        admit=source_filter(settings.metrics_allow),
        embedded=True,
    )
    plane = RunningPlane(server)
    try:
        await plane.start()
    except OSError as exc:
        log.error("metrics disabled: cannot listen on %s:%d: %s", host, port, exc)
        return None
    allowed = ", ".join(settings.metrics_allow) or "none"
    log.info(
        "metrics on http://%s:%d/metrics (other networks allowed: %s)", host, server.port, allowed
    )
    return plane
