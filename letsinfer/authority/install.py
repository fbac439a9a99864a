"""``model install``: which nodes can run a model, with which release and GPUs.

Planning is a pure function of the authority's state and each node's latest
verified facts; applying the plan is one transaction. Nothing changes when the
plan would replace something and the operator did not agree to it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from letsinfer.engines import releases
from letsinfer.engines.releases import Release
from letsinfer.store import AuthorityStore, NodeRecord, StoreError


@dataclass(frozen=True)
class Placement:
    node: NodeRecord
    release: Release
    gpus: tuple[str, ...]
    replaces: str | None = None  # pg id of this model already on that node


@dataclass
class InstallPlan:
    service: str
    placements: list[Placement] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (node, why)

    @property
    def replacing(self) -> list[Placement]:
        return [p for p in self.placements if p.replaces]


@dataclass(frozen=True)
class InstallRequest:
    service: str
    nodes: tuple[str, ...]
    target: str = "auto"  # auto, cpu, cuda
    gpus: int = 1  # per placement group, for GPU targets
    gpu_uuids: tuple[str, ...] = ()  # exact GPUs (one node)
    engine: str = "xllamacpp"
    llama_server_binary: str = "llama-server"


def _targets(node: NodeRecord) -> list[str]:
    return list((node.facts or {}).get("targets", ["cpu"]))


def plan(
    store: AuthorityStore, req: InstallRequest, fresh_within_s: float, main_id: str
) -> InstallPlan:
    svc = store.resolve_service(req.service)
    if svc is None:
        raise StoreError(f"no model {req.service!r}: add it first with `letsinfer model add`")
    out = InstallPlan(service=svc.name)
    existing = {pg.node_id: pg.id for pg in store.list_placement_groups(service=svc.name)}
    now = time.time()
    for name in req.nodes:
        node = store.find_node(name)
        if node is None:
            out.skipped.append((name, "no such node"))
            continue
        if node.id != main_id and (node.facts_at is None or now - node.facts_at > fresh_within_s):
            out.skipped.append((node.name, "unreachable: no fresh facts from its agent"))
            continue
        targets = _targets(node)
        target = req.target if req.target != "auto" else ("cuda" if "cuda" in targets else "cpu")
        if target not in targets:
            out.skipped.append((node.name, f"offers {', '.join(targets)}, not {target}"))
            continue
        gpus: tuple[str, ...] = ()
        if target == "cuda":
            known = [g["uuid"] for g in (node.facts or {}).get("gpus", [])]
            held = store.gpus_in_use(node.id)
            replaced = existing.get(node.id)
            if replaced:
                held -= set(store.pg_gpus(replaced))
            if req.gpu_uuids:
                unknown = [g for g in req.gpu_uuids if g not in known]
                taken = [g for g in req.gpu_uuids if g in held]
                if unknown:
                    out.skipped.append((node.name, f"has no GPU {', '.join(unknown)}"))
                    continue
                if taken:
                    out.skipped.append(
                        (
                            node.name,
                            f"GPU {', '.join(taken)} already belongs to an active placement group",
                        )
                    )
                    continue
                gpus = req.gpu_uuids
            else:
                free = [g for g in known if g not in held]
                if len(free) < req.gpus:
                    out.skipped.append(
                        (
                            node.name,
                            f"needs {req.gpus} free GPU(s); {len(free)} of {len(known)} are free",
                        )
                    )
                    continue
                gpus = tuple(free[: req.gpus])
            release = releases.llama_server(req.llama_server_binary, "cuda")
        else:
            release = releases.for_engine_kind(req.engine, req.llama_server_binary)
        out.placements.append(Placement(node, release, gpus, existing.get(node.id)))
    return out


def apply(
    store: AuthorityStore, p: InstallPlan, sign: Callable[[Release], str], actor: str = "cli"
) -> list[str]:
    """``sign`` gives the release signature the main stores with a new release."""
    created = []
    with store.transaction():
        for pl in p.placements:
            if pl.replaces:
                store.delete_placement_group(pl.replaces)
            r = pl.release
            store.ensure_release(
                r.id, r.engine, r.version, r.target, r.artifacts, r.launch, sign(r)
            )
            pg = store.add_placement_group(
                f"pg-{uuid.uuid4().hex[:12]}", p.service, pl.node.id, r.id, r.target, pl.gpus
            )
            created.append(pg.id)
            store.append_audit(
                actor,
                "model.install",
                "ok",
                target=f"{p.service}@{pl.node.name}",
                detail=f"{pg.id} {r.id} gpus={','.join(pl.gpus) or '-'}"
                + (f" replaces {pl.replaces}" if pl.replaces else ""),
            )
    return created
