"""The state a person is shown for a node, a placement group and a model.

`status`, `model list`, `model show`, `node list`, `topology` and `cluster
status` all call these functions, so no two displays contradict each other,
nor the gateway: a paused node's groups say ``paused`` everywhere while the
gateway refuses them, a group whose engine is still coming up says
``starting``, and a stopped cluster says ``system stopped`` for everything.

What a group's row in the authority says is what its agent last observed;
what is shown also weighs what that observation cannot know: the desired
state, the cluster-stop mark, a paused node, a node whose facts went stale,
the main's process not running (nothing is served), and groups the running
main is draining (only it knows; it says so on its admin socket).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from letsinfer.store import AuthorityStore, NodeRecord, PlacementGroupRecord, ServiceRecord

# Every word a group may be shown with, most final first. "ready": the gateway
# routes to it. Observed states an agent reports (restarting, failed, parked,
# pending, ...) are shown as they are.
GROUP_STATES = (
    "system stopped",  # `cluster stop`: 503 system_stopped
    "stopped",  # `model stop`: its engine is gone
    "stopping",  # asked to stop, its engine not gone yet
    "down",  # the main's process is not running: nothing is served
    "unreachable",  # its node sent no facts lately
    "paused",  # its node is paused, or a data link it needs was lost
    "draining",  # leaving service: requests in flight finish, no new ones
    "starting",  # asked to run, not ready yet
    "ready",
)

# What a model is, from its groups (the gateway's classification, in words).
MODEL_STATES = (
    "serving",  # at least one group is ready
    "not placed",  # no placement group
    "unloaded",  # loaded on demand (`model scale --min 0`): none now, its next request loads it
    "system stopped",
    "stopped",  # every group stopped on purpose
    "parked",  # every group meant to run is parked (503 model_parked)
    "failed",  # every group meant to run is parked or refused to start
    "down",
    "paused",
    "draining",
    "unreachable",
    "starting",  # a transient gap: 503 no_healthy_replica with Retry-After
)


@dataclass(frozen=True)
class Scene:
    """What the states are derived from, read once per command."""

    cluster_stopped: bool
    main_running: bool
    nodes: dict[str, NodeRecord]
    draining: frozenset[str] = frozenset()
    stale_after_s: float = 20.0
    now: float = field(default_factory=time.time)

    @classmethod
    def read(
        cls,
        store: AuthorityStore,
        *,
        main_running: bool,
        draining: Iterable[str] = (),
        stale_after_s: float = 20.0,
    ) -> Scene:
        return cls(
            cluster_stopped=store.cluster_stop() is not None,
            main_running=main_running,
            nodes={n.id: n for n in store.list_nodes(include_removed=True)},
            draining=frozenset(draining),
            stale_after_s=stale_after_s,
        )

    def node_name(self, node_id: str) -> str:
        node = self.nodes.get(node_id)
        return node.name if node is not None else node_id

    # -- nodes ----------------------------------------------------------------
    def node_state(self, node: NodeRecord) -> str:
        """removed, down (the main, not running), unreachable, paused or active."""
        if node.state == "removed":
            return "removed"
        if node.role == "main":
            if not self.main_running:
                return "down"
        elif node.last_seen is None or self.now - node.last_seen >= self.stale_after_s:
            return "unreachable"
        return "paused" if node.paused else "active"

    # -- placement groups -----------------------------------------------------
    def group_state(self, pg: PlacementGroupRecord) -> str:
        if self.cluster_stopped:
            return "system stopped"
        if pg.desired != "running":
            # With the main down nothing serves it, whatever was last observed.
            return "stopped" if pg.state == "stopped" or not self.main_running else "stopping"
        if not self.main_running:
            return "down"
        node = self.nodes.get(pg.node_id)
        where = self.node_state(node) if node is not None else "removed"
        if where in ("unreachable", "removed"):
            return "unreachable"
        if pg.paused_reason or where == "paused":
            return "paused"
        if pg.id in self.draining:
            return "draining"
        current = (pg.observed_generation or 0) == pg.generation
        if not current or pg.state in ("stopped", "pending"):
            return "starting"  # the observation is from before it was (re)started
        return pg.state

    # -- models ---------------------------------------------------------------
    def service_state(
        self,
        svc: ServiceRecord,
        groups: Iterable[PlacementGroupRecord],
        on_demand: bool = False,
    ) -> str:
        """A model's state; an external one (no groups) is serving while the
        gateway publishes it (whether its provider answers, each request finds).
        A model loaded on demand (`model scale --min 0`) with no group now is
        unloaded: its next request loads it."""
        if not svc.is_external:
            shown = list(groups)
            if on_demand and not shown and not self.cluster_stopped:
                return "unloaded"
            return self.model_state(shown)
        if self.cluster_stopped:
            return "system stopped"
        return "stopped" if svc.external_stopped else "serving"

    def model_state(self, groups: Iterable[PlacementGroupRecord]) -> str:
        shown = [self.group_state(pg) for pg in groups]
        if "ready" in shown:
            return "serving"
        if not shown:
            return "system stopped" if self.cluster_stopped else "not placed"
        if self.cluster_stopped:
            return "system stopped"
        meant = [s for s in shown if s not in ("stopped", "stopping")]
        if not meant:
            return "stopped"
        if all(s == "parked" for s in meant):
            return "parked"
        if all(s in ("parked", "failed") for s in meant):
            return "failed"
        for word in ("down", "paused", "draining", "unreachable"):
            if word in meant:
                return word
        return "starting"


def ready_count(scene: Scene, groups: Iterable[PlacementGroupRecord]) -> int:
    return sum(scene.group_state(pg) == "ready" for pg in groups)
