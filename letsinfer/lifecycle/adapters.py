"""A model's engines load its LoRA adapters again, one group at a time.

llama.cpp loads adapters only when its server starts, so after `model adapter
add` or `remove` each group of the base model starts afresh with the model's
adapters as the authority lists them now, proven before the next group does
the same: beside the old group where capacity allows (which then drains and
goes), else in place (lifecycle/restarts.py), when a model with no other group
serving has a short gap (its clients get ``no_healthy_replica`` with
``Retry-After``; the result says so). Stops at the first group that does not
come back, and the groups after it keep the adapters they were launched with
(pinned when the adapters changed) until a restart; groups on unreachable
nodes are skipped and unpinned: when such a node is back, its agent finds its
engine's adapters (by name and file) unlike the model's and starts it afresh
(letsinfer.agent.placement).
"""

from __future__ import annotations

import logging

from letsinfer.authority import lifecycle
from letsinfer.lifecycle import restarts
from letsinfer.lifecycle.serving import Serving

log = logging.getLogger("letsinfer.lifecycle")


async def reload(sv: Serving, model: str, *, actor: str, role: str | None) -> dict[str, object]:
    store = sv.store
    svc = store.resolve_service(model)
    if svc is None:
        raise lifecycle.NotFound(f"no model {model!r}")
    groups = [pg for pg in store.list_placement_groups(service=svc.name) if pg.desired == "running"]
    nodes = {n.id: n.name for n in store.list_nodes(include_removed=True)}
    outcomes: list[dict[str, object]] = []
    ok = True
    for pg in groups:
        row: dict[str, object] = {"group": pg.id, "node": nodes.get(pg.node_id, pg.node_id)}
        outcomes.append(row)
        if not ok:
            row["outcome"] = "not tried"
            continue
        away = sv.unreachable(pg.node_id)
        if away is not None:
            store.unpin_adapters([pg.id])  # its agent restarts it when it hears of them
            row["outcome"] = f"skipped: {away}"
            continue
        log.info("model %s: %s loads the model's adapters again", svc.name, pg.id)
        fresh = store.get_placement_group(pg.id)  # its state now, after the ones before
        if fresh is None:
            row["outcome"] = "gone meanwhile"
            continue
        renewed = await restarts.restart_group(sv, fresh, str(row["node"]))
        row.update(renewed.to_json())
        ok = renewed.ready
    store.append_audit(
        actor,
        "model.adapters.reload",
        "ok" if ok else "failed",
        role=role,
        target=svc.name,
        detail="; ".join(f"{r['group']} {r['outcome']}" for r in outcomes)[:2000] or None,
    )
    return {"ok": ok, "model": svc.name, "placement_groups": outcomes}
