"""The whole cluster at once, run by the main: stop (drain, then every group
stops and the gateway answers ``system_stopped``), start (exactly the groups
the stop stopped), and a rolling restart, node by node and group by group, so
a model keeps serving throughout: from another replica, or from a fresh
engine started beside the old one where capacity allows (lifecycle/restarts.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from letsinfer.authority import lifecycle
from letsinfer.lifecycle import restarts
from letsinfer.lifecycle.serving import Serving, Started

log = logging.getLogger("letsinfer.lifecycle")

# Engines stop within their grace period once their agent hears of it.
STOP_WAIT_S = 120.0


@dataclass
class NodeRestart:
    node: str
    groups: dict[str, str] = field(default_factory=dict)  # pg id -> how it came back

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "placement_groups": self.groups}


async def stop(sv: Serving, *, actor: str, role: str | None) -> dict[str, object]:
    state = lifecycle.begin_cluster_stop(sv.store, actor=actor, role=role)
    sv.apply()  # the gateway refuses new requests from here on
    groups = set(state.groups)
    log.info("cluster stop: draining %d placement group(s)", len(groups))
    cut = await sv.drain(groups)
    lifecycle.complete_cluster_stop(sv.store, state)
    sv.apply()
    still = await sv.stopped(groups, STOP_WAIT_S)
    sv.routing.undrain(groups)
    log.info("cluster stopped (%d request(s) cut, %d group(s) not yet stopped)", cut, len(still))
    return {
        "stopped": sorted(groups),
        "cut": cut,
        "still_running": sorted(still),
    }


async def start(sv: Serving, *, actor: str, role: str | None) -> dict[str, object]:
    groups = lifecycle.start_cluster(sv.store, actor=actor, role=role)
    sv.apply()
    log.info("cluster start: %d placement group(s)", len(groups))
    came: dict[str, Started] = {}
    for pg_id in groups:
        came[pg_id] = await sv.started(pg_id)
    return {
        "started": groups,
        "placement_groups": {pg: s.why() for pg, s in came.items()},
        "ok": all(s.ready for s in came.values()),
    }


async def restart(sv: Serving, *, actor: str, role: str | None) -> dict[str, object]:
    """Node by node (children first, the main last), one group at a time: each
    starts afresh beside itself where capacity allows, else in place (its model
    goes dark meanwhile when nothing else serves it: said in ``dark``); each is
    proven before the next. Stops at the first group that does not come back."""
    store = sv.store
    if lifecycle.cluster_state(store).stopped:
        raise lifecycle.Refused("the cluster is stopped; `letsinfer cluster start` starts it")
    nodes = sorted(store.list_nodes(), key=lambda n: (n.role == "main", n.name))
    done: list[NodeRestart] = []
    dark: list[str] = []
    ok = True
    for node in nodes:
        groups = sorted(
            (pg for pg in store.list_placement_groups(node_id=node.id) if pg.desired == "running"),
            key=lambda pg: pg.id,
        )
        if not groups:
            continue
        step = NodeRestart(node.name)
        done.append(step)
        if not ok:
            step.groups = {pg.id: "not tried" for pg in groups}
            continue
        away = sv.unreachable(node.id)
        if away is not None:  # cannot be restarted now; they run on as they are
            step.groups = {pg.id: f"skipped: {away}" for pg in groups}
            continue
        log.info("cluster restart: %s (%d placement group(s))", node.name, len(groups))
        for pg in groups:
            if not ok:
                step.groups[pg.id] = "not tried"
                continue
            fresh = store.get_placement_group(pg.id)  # its state now, after the ones before
            if fresh is None:
                continue
            renewed = await restarts.restart_group(sv, fresh, node.name)
            step.groups[pg.id] = renewed.how
            ok = renewed.ready
            if renewed.dark:
                dark.append(f"{pg.id} on {node.name}: {renewed.dark}")
    store.append_audit(
        actor,
        "cluster.restart",
        "ok" if ok else "failed",
        role=role,
        detail="; ".join(
            f"{s.node}: " + ", ".join(f"{g} {w}" for g, w in s.groups.items()) for s in done
        )[:2000]
        or None,
    )
    return {"ok": ok, "nodes": [s.to_json() for s in done], "dark": dark}
