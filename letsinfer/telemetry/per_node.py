"""One node's share of the main's metrics, for ``/metrics?node=NAME``.

The main makes every node's series (children have no metrics listener), each
labelled ``node``; service discovery (letsinfer.telemetry.discovery) lists
every active node as a target of its own on the main's listener, scraped with
``?node=NAME``. What a node's target serves is filtered here from the same
collectors as plain ``/metrics``, family by family: a child's target gets the
samples labelled with its name; the main's gets its own, the ones with no
``node`` label (gateway, models, keys, control plane) and the ones naming no
active node (a group still recorded on a removed node), so scraping every
target yields every sample exactly once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample

from letsinfer.telemetry.view import NodeSample

Keep = Callable[[str | None], bool]  # a sample's node label (None: none) -> served


class NodeSamples(Collector):
    """``registry``'s families, each copied with only the samples ``keep``
    takes (families left empty stay, with their help and type)."""

    def __init__(self, registry: CollectorRegistry, keep: Keep) -> None:
        self.registry = registry
        self.keep = keep

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            kept = copy.copy(family)
            kept.samples = [s for s in family.samples if self.keep(_node(s))]
            yield kept

    def restricted_registry(self, names: Iterable[str]) -> NodeSamples:
        """For ``name[]`` in the query, as prometheus_client's exposition asks."""
        return NodeSamples(self.registry.restricted_registry(names), self.keep)


def _node(sample: Sample) -> str | None:
    return sample.labels.get("node")


def node_filter(nodes: Iterable[NodeSample], name: str) -> Keep | None:
    """Which samples ``name``'s target serves, among the active ``nodes``;
    None when no active node has that name."""
    active = {n.name: n for n in nodes if n.state == "active"}
    node = active.get(name)
    if node is None:
        return None
    if node.role != "main":
        return lambda label: label == name
    return lambda label: label is None or label == name or label not in active
