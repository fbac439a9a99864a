"""`model plan`: where a model would go, and why not elsewhere, changing
nothing; the same planner as `model install`. One reading for the CLI on
the main and the admin API, so a controller prints the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from letsinfer import config
from letsinfer.admission.gguf import fit_text
from letsinfer.authority import install as install_mod
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.fit.shape import ShapeError, read_shape
from letsinfer.store import AuthorityStore, StoreError


def planned(
    store: AuthorityStore,
    model_store: Path,
    settings: config.Settings,
    main_node_id: str,
    name: str,
    target: str,
    gpus: int,
    engine: str | None,
) -> dict[str, Any]:
    """``model``: the model NAME names; ``nodes``: one row per active node
    (what `model plan --json` prints); ``fits``: what each placement needs, as
    the text output says it. StoreError: no such model, or no shape to fit."""
    shape = None
    svc = store.resolve_service(name)
    if svc is not None and not svc.is_external:  # (else the planner says why itself)
        try:
            shape = read_shape(artifact_path(model_store, svc.artifact_digest))
        except ShapeError as exc:
            raise StoreError(
                f"{exc}: cannot check whether {svc.name} fits anywhere. Nothing changed."
            ) from exc
    req = install_mod.InstallRequest(
        service=name,
        nodes=tuple(n.name for n in store.list_nodes() if n.state == "active"),
        target=target,
        gpus=gpus,
        gpu_uuids=(),
        engine=engine or settings.engine.kind,
        llama_server_binary=settings.engine.llama_server_binary,
        shape=shape,
        context=settings.engine.context,
        slots=settings.engine.parallel,
    )
    found = install_mod.plan(store, req, settings.control.node_stale_after_s, main_node_id)
    rows: list[dict[str, Any]] = [
        {
            "node": p.node.name,
            "fits": True,
            "target": p.release.target,
            "gpus": list(p.gpus),
            "release": p.release.id,
            "needs": p.need.to_json(max(len(p.gpus), 1)) if p.need else None,
            "replaces": p.replaces,
            "reason": None,
        }
        for p in found.placements
    ]
    rows += [
        {
            "node": node_name,
            "fits": False,
            "target": None,
            "gpus": [],
            "release": None,
            "needs": None,
            "replaces": None,
            "reason": why,
        }
        for node_name, why in found.skipped
    ]
    rows.sort(key=lambda r: r["node"])
    fits = {p.node.name: fit_text(p) for p in found.placements if p.need}
    return {"model": found.service, "nodes": rows, "fits": fits}
