"""A model's engines load its LoRA adapters again, one group at a time.

llama.cpp loads adapters only when its server starts, so after `model adapter
add` or `remove` each group of the base model restarts: it drains (no new
admission, requests in flight finish), its engine starts afresh with the
model's adapters as the authority lists them now, and it admits again once
proven, before the next group does the same. A model with several groups
keeps serving throughout; a model with one has a short gap (its clients get
``no_healthy_replica`` with ``Retry-After``). Stops at the first group that
does not come back; groups on unreachable nodes are skipped: when such a node
is back, its agent finds its engine's adapters (by name and file) unlike the
model's and starts it afresh (letsinfer.agent.placement).
"""

from __future__ import annotations

import logging

from letsinfer.authority import lifecycle
from letsinfer.lifecycle.serving import Serving

log = logging.getLogger("letsinfer.lifecycle")


async def reload(sv: Serving, model: str, *, actor: str, role: str | None) -> dict[str, object]:
    store = sv.store
    svc = store.resolve_service(model)
    if svc is None:
        raise lifecycle.NotFound(f"no model {model!r}")
    groups = [pg for pg in store.list_placement_groups(service=svc.name) if pg.desired == "running"]
    nodes = {n.id: n.name for n in store.list_nodes(include_removed=True)}
    outcomes: list[dict[str, str]] = []
    ok = True
    for pg in groups:
        row = {"group": pg.id, "node": nodes.get(pg.node_id, pg.node_id)}
        outcomes.append(row)
        if not ok:
            row["outcome"] = "not tried"
            continue
        away = sv.unreachable(pg.node_id)
        if away is not None:
            row["outcome"] = f"skipped: {away}"
            continue
        log.info("model %s: %s loads the model's adapters again", svc.name, pg.id)
        cut = await sv.drain({pg.id})
        try:
            store.restart_groups([pg.id])
            sv.apply()
            came = await sv.started(pg.id)
        finally:
            sv.routing.undrain({pg.id})
        row["outcome"] = came.why() + (f" ({cut} request(s) cut)" if cut else "")
        ok = came.ready
    store.append_audit(
        actor,
        "model.adapters.reload",
        "ok" if ok else "failed",
        role=role,
        target=svc.name,
        detail="; ".join(f"{r['group']} {r['outcome']}" for r in outcomes)[:2000] or None,
    )
    return {"ok": ok, "model": svc.name, "placement_groups": outcomes}
