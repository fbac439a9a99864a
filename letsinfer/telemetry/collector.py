"""The cluster's Prometheus series, made when Prometheus scrapes from the
main's in-memory view (nodes, groups, their signed facts) and routing table.

Labels are bounded by what the operator created: models, placement groups,
nodes, GPUs. No prompt text, no key material.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from letsinfer.gateway.routing import RoutingTable
from letsinfer.telemetry.view import ClusterView


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class ControlLoad(Protocol):
    """How the control plane keeps up with its nodes' reports
    (letsinfer.authority.overload.Shedder)."""

    share: float  # of reports shed now
    lag_s: float  # how late its event loop runs
    reports: int  # reports that reached it
    shed: int  # of them, answered 503


class ClusterCollector(Collector):
    """``attention``: the main's attention clock, on which a node's facts
    age (it stands still while the main sheds load); ``control``: the control
    plane's load."""

    def __init__(
        self,
        view: ClusterView,
        routing: RoutingTable,
        clock: Callable[[], float] = time.time,
        attention: Callable[[], float] | None = None,
        control: ControlLoad | None = None,
    ) -> None:
        self.view = view
        self.routing = routing
        self.clock = clock
        self.attention = attention
        self.control = control

    def collect(self) -> Iterator[Metric]:
        yield from self._models()
        yield from self._groups()
        yield from self._nodes()
        yield from self._gpus()
        if self.control is not None:
            yield from self._control(self.control)

    def _control(self, load: ControlLoad) -> Iterator[Metric]:
        share = _gauge(
            "letsinfer_control_shed_ratio",
            "Share of node reports the main answers 503 now, to keep up (0: it takes all).",
            [],
        )
        share.add_metric([], load.share)
        lag = _gauge(
            "letsinfer_control_loop_lag_seconds",
            "How late the control plane's event loop runs (its own timers fire late by this).",
            [],
        )
        lag.add_metric([], load.lag_s)
        reports = CounterMetricFamily(
            "letsinfer_control_reports", "Node reports (signed facts) that reached the main."
        )
        reports.add_metric([], load.reports)
        shed = CounterMetricFamily(
            "letsinfer_control_reports_shed",
            "Node reports the main answered 503 with Retry-After because it was behind.",
        )
        shed.add_metric([], load.shed)
        yield from (share, lag, reports, shed)

    def _models(self) -> Iterator[Metric]:
        ready = _gauge(
            "letsinfer_model_ready_groups",
            "Placement groups of a model the gateway can route to now (0: requests get 503).",
            ["model"],
        )
        meant = _gauge(
            "letsinfer_model_groups",
            "Placement groups of a model that are meant to run (desired running).",
            ["model"],
        )
        models = dict.fromkeys([*self.view.models, *self.routing.services()])
        for model in models:
            ready.add_metric([model], self.routing.ready_count(model))
            running = [g for g in self.view.groups if g.model == model and g.desired == "running"]
            meant.add_metric([model], len(running))
        yield ready
        yield meant

    def _groups(self) -> Iterator[Metric]:
        state = _gauge(
            "letsinfer_group_state",
            "1 for each placement group, labelled with its desired and observed state "
            "(ready, starting, restarting, failed, parked, stopped, ...).",
            ["model", "pg", "node", "desired", "state"],
        )
        routable = _gauge(
            "letsinfer_group_ready",
            "1 when the gateway routes to the placement group now, else 0.",
            ["model", "pg", "node"],
        )
        restarts = CounterMetricFamily(
            "letsinfer_group_restarts",
            "Engine restarts of a placement group, as its agent reports them.",
            labels=["model", "pg", "node"],
        )
        free = _gauge(
            "letsinfer_group_free_slots",
            "Request slots of a routable placement group not taken by the gateway now.",
            ["model", "pg"],
        )
        engine_queue = _gauge(
            "letsinfer_group_engine_queue_depth",
            "Requests queued inside the engine, from its node's latest facts.",
            ["model", "pg"],
        )
        for g in self.view.groups:
            state.add_metric([g.model, g.pg_id, g.node, g.desired, g.state], 1)
            restarts.add_metric([g.model, g.pg_id, g.node], g.restarts)
            replica = next((r for r in self.routing.replicas(g.model) if r.pg_id == g.pg_id), None)
            up = replica is not None and not replica.paused
            routable.add_metric([g.model, g.pg_id, g.node], 1 if up else 0)
        for model in self.routing.services():
            for r in self.routing.replicas(model):
                free.add_metric([model, r.pg_id], max(0, r.capacity - r.in_flight))
                if r.queue_depth is not None:
                    engine_queue.add_metric([model, r.pg_id], r.queue_depth)
        yield state
        yield routable
        yield restarts
        yield free
        yield engine_queue

    def _nodes(self) -> Iterator[Metric]:
        now = self.clock()
        info = _gauge("letsinfer_node_info", "1 for each node, with its role.", ["node", "role"])
        age = _gauge(
            "letsinfer_node_facts_age_seconds",
            "Seconds since the node's latest verified facts reached the main (time the "
            "main spent shedding load does not count).",
            ["node"],
        )
        cert = _gauge(
            "letsinfer_node_certificate_expiry_seconds",
            "Seconds until the certificate the node last presented expires (negative: expired).",
            ["node"],
        )
        firewall = _gauge(
            "letsinfer_node_firewall_loaded",
            "1 when the node reports its nftables table inet letsinfer loaded, 0 when not.",
            ["node"],
        )
        audit = _gauge(
            "letsinfer_node_audit_problem",
            "1 when the node's signed audit head disagrees with what the main witnessed.",
            ["node"],
        )
        paused = _gauge("letsinfer_node_paused", "1 when the node admits no new work.", ["node"])
        attending = self.attention() if self.attention is not None else None
        for n in self.view.nodes:
            info.add_metric([n.name, n.role], 1)
            if n.heard_at is not None and attending is not None:
                age.add_metric([n.name], max(0.0, attending - n.heard_at))
            elif n.facts_at is not None:
                age.add_metric([n.name], max(0.0, now - n.facts_at))
            if n.cert_not_after is not None:
                cert.add_metric([n.name], n.cert_not_after - now)
            if n.firewall is not None:
                firewall.add_metric([n.name], 1 if n.firewall else 0)
            audit.add_metric([n.name], 1 if n.audit_problem else 0)
            paused.add_metric([n.name], 1 if n.paused else 0)
        yield from (info, age, cert, firewall, audit, paused)

    def _gpus(self) -> Iterator[Metric]:
        labels = ["node", "gpu"]
        temp = _gauge("letsinfer_gpu_temperature_celsius", "GPU temperature.", labels)
        power = _gauge("letsinfer_gpu_power_watts", "GPU power draw.", labels)
        util = _gauge("letsinfer_gpu_utilization_ratio", "GPU utilisation, 0 to 1.", labels)
        total = _gauge("letsinfer_gpu_memory_total_bytes", "GPU memory.", labels)
        free = _gauge("letsinfer_gpu_memory_free_bytes", "GPU memory free.", labels)
        for n in self.view.nodes:
            for g in n.gpus:
                key = [n.name, str(g.get("uuid"))]
                if g.get("temperature_c") is not None:
                    temp.add_metric(key, g["temperature_c"])
                if g.get("power_w") is not None:
                    power.add_metric(key, g["power_w"])
                if g.get("utilization") is not None:
                    util.add_metric(key, g["utilization"] / 100)
                if g.get("memory_total") is not None:
                    total.add_metric(key, g["memory_total"])
                if g.get("memory_free") is not None:
                    free.add_metric(key, g["memory_free"])
        yield from (temp, power, util, total, free)
