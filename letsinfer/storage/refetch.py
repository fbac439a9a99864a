"""Which nodes download a model again when its groups start: those whose latest
facts do not list the model's file (a cleanup released it while the groups were
stopped). Each of them fetches and verifies the exact file before its group
serves (agent/placement.py)."""

from __future__ import annotations

from typing import Any

from letsinfer.store import AuthorityStore


def downloads(store: AuthorityStore, model: str) -> list[dict[str, Any]]:
    svc = store.resolve_service(model)
    if svc is None:
        return []
    nodes = {n.id: n for n in store.list_nodes()}
    out: dict[str, dict[str, Any]] = {}
    for pg in store.list_placement_groups(service=svc.name):
        for task in store.pg_tasks(pg.id):
            node = nodes.get(task.node_id)
            held = (node.facts or {}).get("artifacts") if node else None
            if node is not None and isinstance(held, list) and svc.artifact_digest not in held:
                out[node.name] = {"node": node.name, "artifact": svc.artifact_digest}
    return sorted(out.values(), key=lambda d: d["node"])
