"""The objects the main's displays print, one shape per kind (docs/json.md).

A placement group is the same object in `status`, `model list`, `model show`,
`topology` and `cluster status`; a model the same in `status`, `model list`
and `model show`; a node the same in `node list`, `topology` and `cluster
status`. Every state in them comes from letsinfer.authority.states.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from letsinfer.authority.lifecycle import cluster_state
from letsinfer.authority.states import Scene
from letsinfer.engines.releases import LLAMA_SERVER_ARTIFACT
from letsinfer.store import (
    AuthorityStore,
    NodeRecord,
    PlacementGroupRecord,
    ServiceRecord,
    StoreError,
)


def when(ts: float | None) -> str | None:
    """A time as ISO 8601 UTC (seconds), the one way JSON spells times."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else None


def group_object(store: AuthorityStore, scene: Scene, pg: PlacementGroupRecord) -> dict[str, Any]:
    return {
        "id": pg.id,
        "model": pg.service,
        "node": scene.node_name(pg.node_id),
        "target": pg.target,
        "release": pg.release_id,
        "gpus": store.pg_gpus(pg.id),
        "desired": pg.desired,
        "state": scene.group_state(pg),
        "endpoint": pg.endpoint,
        "pid": pg.pid,
        "capacity": pg.capacity,
        "restarts": pg.restarts,
        "detail": pg.detail,
        "paused": pg.paused_reason,
        "generation": pg.generation,
        # Its own weights while an update rolls out (None: its model's).
        "weights": pg.artifact_digest,
        "tasks": [
            {
                "task": t.task,
                "node": scene.node_name(t.node_id),
                "address": t.address,
                "port": t.port,
                "gpus": store.task_gpus(pg.id, t.task),
                "state": t.state,
                "detail": t.detail,
            }
            for t in store.pg_tasks(pg.id)
        ],
    }


def model_object(store: AuthorityStore, scene: Scene, svc: ServiceRecord) -> dict[str, Any]:
    pgs = store.list_placement_groups(service=svc.name)
    policy = store.scaling_policy(svc.name)
    o = svc.origin or {}
    return {
        "name": svc.name,
        "aliases": list(svc.aliases),
        "kind": svc.kind,
        "format": svc.format,
        "sha256": svc.artifact_digest,
        "size": svc.artifact_size,
        # Where a pulled model came from (all null for a model added from a file).
        "repo": o.get("repo"),
        "revision": o.get("revision"),
        "commit": o.get("commit"),
        "files": o.get("files", []),
        "state": scene.service_state(svc, pgs, on_demand=policy.on_demand),
        "ready": sum(scene.group_state(pg) == "ready" for pg in pgs),
        "total": len(pgs),
        "placement_groups": [group_object(store, scene, pg) for pg in pgs],
        # How many groups it keeps and when it loads (`letsinfer model scale`).
        "scaling": policy.to_json(),
        **external_fields(store, svc),
        # Releases this model ran: what `model rollback --to` may reinstall.
        "releases": [
            {
                "release": h.release_id,
                "node": scene.node_name(h.node_id),
                "placement_group": h.pg_id,
                "event": h.event,
                "at": when(h.at),
            }
            for h in store.release_history(svc.name)
        ],
        # Weights it ran: what `model rollback --weights` may go back to.
        "weights": [
            {"sha256": w.artifact_digest, "commit": w.commit, "event": w.event, "at": when(w.at)}
            for w in store.weights_history(svc.name)
        ],
        "gate": _gate(store, svc.name),
    }


def _gate(store: AuthorityStore, model: str) -> dict[str, Any] | None:
    gate = store.get_gate(model)
    return None if gate is None else {"suite": gate.suite, "min_score": gate.min_score}


def external_fields(store: AuthorityStore, svc: ServiceRecord) -> dict[str, Any]:
    """A model's provider (None for a model its own engines serve), its fallback
    and its LoRA adapters, as `model list` and `model show` put them."""
    return {
        "external": dict(svc.external) if svc.external else None,
        "fallback": svc.fallback,
        "adapters": [a.name for a in store.list_adapters(svc.name)],
    }


def node_object(scene: Scene, n: NodeRecord) -> dict[str, Any]:
    return {
        "name": n.name,
        "id": n.id,
        "role": n.role,
        "address": n.address,
        "state": scene.node_state(n),
        "paused": n.paused,
        "last_seen": when(n.last_seen),
        "removed_at": when(n.removed_at),
        "fingerprint": n.cert_fingerprint,
    }


def adapter_refusal(store: AuthorityStore, name: str) -> str | None:
    """What NAME is when it names no model but a LoRA adapter (clients ask for
    adapters by name, so operators do too); None otherwise."""
    if store.resolve_service(name) is not None:
        return None
    found = store.get_adapter(name)
    if found is None:
        return None
    return (
        f"{name!r} is a LoRA adapter of model {found.service!r}, not a model; "
        f"see `letsinfer model adapter list {found.service}`"
    )


def adapter_named(store: AuthorityStore, name: str, verb: str) -> str | None:
    """Why `model VERB NAME` is refused when NAME names a LoRA adapter (the
    authority would only say there is no such model); None otherwise. The
    CLI on the main and the admin API say it alike."""
    why = adapter_refusal(store, name)
    return None if why is None else f"{why} (`letsinfer model {verb}` takes its base model)"


def shown_model(store: AuthorityStore, scene: Scene, name: str) -> dict[str, Any]:
    """`model show NAME --json`: the model NAME names (or alias), or StoreError."""
    svc = store.resolve_service(name)
    if svc is None:
        raise StoreError(adapter_refusal(store, name) or f"no model {name!r}")
    return model_object(store, scene, svc)


def cluster_object(store: AuthorityStore, scene: Scene) -> dict[str, Any]:
    """`cluster status --json`: whether the cluster runs, and every node with
    its placement groups."""
    state = cluster_state(store)
    return {
        "stopped": state.stopped,
        "stopped_at": when(state.stopped_at),
        "groups": state.groups,
        "nodes": [
            {
                **node_object(scene, n),
                "placement_groups": [
                    group_object(store, scene, pg)
                    for pg in store.list_placement_groups(node_id=n.id)
                ],
            }
            for n in store.list_nodes()
        ],
    }


def release_rows(store: AuthorityStore) -> list[dict[str, Any]]:
    """`release list --json`: every runtime release in the authority and the
    placement groups that run it."""
    groups = store.list_placement_groups()
    return [
        {
            "id": r["id"],
            "engine": r["engine"],
            "version": r["version"],
            "target": r["target"],
            "binary": r["launch"].get("binary"),
            "sha256": r["artifacts"].get(LLAMA_SERVER_ARTIFACT),
            "signed": bool(r["signature"]),
            "placement_groups": [
                {"id": pg.id, "model": pg.service} for pg in groups if pg.release_id == r["id"]
            ],
        }
        for r in store.list_releases()
    ]


def topology_objects(store: AuthorityStore, scene: Scene) -> list[dict[str, Any]]:
    """`topology --json`: each node, its GPUs, the placement groups on it and
    its data links (the CLI on the main and the admin API alike)."""
    out = []
    links = store.list_links()
    for n in store.list_nodes():
        pgs = [
            pg
            for t in store.tasks_on_node(n.id)
            if (pg := store.get_placement_group(t.pg_id)) is not None
        ]
        gpus = (n.facts or {}).get("gpus", [])
        out.append(
            {
                **node_object(scene, n),
                "targets": (n.facts or {}).get("targets", []),
                "gpus": [
                    {
                        "uuid": g["uuid"],
                        "name": g["name"],
                        "temperature_c": g.get("temperature_c"),
                        "placement_group": next(
                            (pg.id for pg in pgs if g["uuid"] in store.pg_gpus(pg.id)), None
                        ),
                    }
                    for g in gpus
                ],
                "placement_groups": [group_object(store, scene, pg) for pg in pgs],
                "links": [
                    {
                        "peer": scene.node_name(other),
                        "state": link.state,
                        "changed_at": when(link.changed_at),
                    }
                    for link in links
                    if n.id in (link.node_a, link.node_b)
                    for other in [link.node_b if link.node_a == n.id else link.node_a]
                ],
            }
        )
    return out
