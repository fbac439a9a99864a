"""The objects the main's displays print, one shape per kind (docs/json.md).

A placement group is the same object in `status`, `model list`, `model show`,
`topology` and `cluster status`; a model the same in `status`, `model list`
and `model show`; a node the same in `node list`, `topology` and `cluster
status`. Every state in them comes from letsinfer.authority.states.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from letsinfer.authority.states import Scene
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
    }


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


def shown_model(store: AuthorityStore, scene: Scene, name: str) -> dict[str, Any]:
    """`model show NAME --json`: the model NAME names (or alias), or StoreError."""
    svc = store.resolve_service(name)
    if svc is None:
        raise StoreError(adapter_refusal(store, name) or f"no model {name!r}")
    return model_object(store, scene, svc)
