"""What capacity does, for Prometheus: loads by reason, how long they take,
evictions, unloads, refusals for want of room, and each managed model's
groups. Registered in the gateway's registry (served with its metrics)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Loads take from under a second (a small GGUF on a warm disk) to minutes.
_LOAD_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class _States(Collector):
    """``letsinfer_model_state``: 1 for each managed model, labelled with its
    state (loaded, loading, unloaded, scaling), read from the controller's last
    round (a copy: scrapes run on another thread)."""

    def __init__(self, states: Callable[[], dict[str, str]]) -> None:
        self.states = states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "letsinfer_model_state",
            "1 for each model with a scaling policy, labelled with its state: loaded, "
            "loading (for a request), unloaded (on demand, no group now) or scaling.",
            labels=["model", "state"],
        )
        for model, state in sorted(dict(self.states()).items()):
            family.add_metric([model, state], 1)
        yield family


class CapacityMetrics:
    def __init__(
        self, registry: CollectorRegistry, states: Callable[[], dict[str, str]] = dict
    ) -> None:
        registry.register(_States(states))
        self.loads = Counter(
            "letsinfer_capacity_loads",
            "Placement groups loaded by the capacity controller, by reason "
            "(request: a request found the model unloaded; load: requests in flight "
            "above the target; minimum: fewer groups than --min).",
            ["model", "reason"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "letsinfer_capacity_load_seconds",
            "From a load's decision until its group serves (what a request for an "
            "unloaded model waits, at most).",
            ["model"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        self.evictions = Counter(
            "letsinfer_capacity_evictions",
            "Idle on-demand groups unloaded to make room for another model's load.",
            ["model"],
            registry=registry,
        )
        self.unloads = Counter(
            "letsinfer_capacity_unloads",
            "Groups unloaded by the capacity controller (idle: on demand and idle; "
            "scale: one fewer after calm).",
            ["model", "reason"],
            registry=registry,
        )
        self.exhausted = Counter(
            "letsinfer_capacity_exhausted",
            "Loads refused for want of room (503 capacity_exhausted when nothing serves).",
            ["model"],
            registry=registry,
        )
        self.groups = Gauge(
            "letsinfer_capacity_groups",
            "Placement groups each model with a scaling policy has now.",
            ["model"],
            registry=registry,
        )
