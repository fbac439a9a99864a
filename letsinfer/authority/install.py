"""``model install``: which nodes can run a model, with which release and GPUs.

Planning is a pure function of the authority's state and each node's latest
verified facts; applying the plan is one transaction. Nothing changes when the
plan would replace something and the operator did not agree to it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from letsinfer.engines import releases
from letsinfer.engines.binary import BinaryError
from letsinfer.engines.releases import Release
from letsinfer.fit.estimate import MemoryNeed, estimate, gpu_refusal, ram_refusal
from letsinfer.fit.shape import ModelShape
from letsinfer.store import AuthorityStore, NodeRecord, StoreError, TaskSpec


@dataclass(frozen=True)
class Placement:
    node: NodeRecord
    release: Release
    gpus: tuple[str, ...]
    replaces: str | None = None  # pg id of this model already on that node
    need: MemoryNeed | None = None  # what the memory-fit check found it needs


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
    parallel: bool = False  # one placement group, one task per node
    engine_explicit: bool = False  # the operator named a (single-device) engine
    # The memory-fit check: the model's shape (from its GGUF header) and the
    # engine settings it runs with. No shape: no check.
    shape: ModelShape | None = None
    context: int = 4096
    slots: int = 4


def memory_refusal(
    req: InstallRequest, node: NodeRecord, target: str, engine: str, gpus: tuple[str, ...]
) -> tuple[MemoryNeed | None, str | None]:
    """The memory-fit check, apart from the rest: what the model needs on this
    node's RAM or on these GPUs, and why it does not fit (None when it does)."""
    if req.shape is None:
        return None, None
    need = estimate(req.shape, engine, target, req.context, req.slots)
    facts = node.facts or {}
    if target == "cpu":
        return need, ram_refusal(need, facts)
    by_uuid = {g["uuid"]: g for g in facts.get("gpus", [])}
    return need, gpu_refusal(need, [by_uuid[u] for u in gpus if u in by_uuid])


def _targets(node: NodeRecord) -> list[str]:
    return list((node.facts or {}).get("targets", ["cpu"]))


def plan(
    store: AuthorityStore, req: InstallRequest, fresh_within_s: float, main_id: str
) -> InstallPlan:
    svc = store.resolve_service(req.service)
    if svc is None:
        raise StoreError(f"no model {req.service!r}: add it first with `letsinfer model add`")
    if svc.is_external:
        raise StoreError(f"model {svc.name} is external: its provider serves it, not a node")
    return plan_groups(store, replace(req, service=svc.name), fresh_within_s, main_id)


def plan_groups(
    store: AuthorityStore, req: InstallRequest, fresh_within_s: float, main_id: str
) -> InstallPlan:
    """The planner itself, for ``req.service`` by its canonical name: also for a
    model `model add` and `model pull` are adding (not recorded yet)."""
    out = InstallPlan(service=req.service)
    existing = {pg.node_id: pg.id for pg in store.list_placement_groups(service=req.service)}
    now = time.time()
    made: dict[tuple[str, str], Release | BinaryError] = {}

    def release_for(engine: str, target: str) -> Release:
        """Once per plan: a llama-server release hashes and asks its binary."""
        if (engine, target) not in made:
            try:
                made[(engine, target)] = releases.for_engine_kind(
                    engine, req.llama_server_binary, target
                )
            except BinaryError as exc:
                made[(engine, target)] = BinaryError(
                    f"cannot release the llama-server binary: {exc}"
                )
        found = made[(engine, target)]
        if isinstance(found, BinaryError):
            raise found
        return found

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
            # Most free memory first (a stable sort: equal GPUs keep their order).
            known = [
                g["uuid"]
                for g in sorted(
                    (node.facts or {}).get("gpus", []), key=lambda g: -int(g.get("memory_free", 0))
                )
            ]
            held = store.gpus_in_use(node.id)
            replaced = existing.get(node.id)
            own = set(store.pg_gpus(replaced)) if replaced else set()
            held -= own
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
                # A replacement starts beside the group it replaces when other
                # GPUs are free; only otherwise on that group's own GPUs.
                free = [g for g in known if g not in held and g not in own]
                if len(free) < req.gpus and len(own) == req.gpus:
                    free = sorted(own)
                if len(free) < req.gpus:
                    out.skipped.append(
                        (
                            node.name,
                            f"needs {req.gpus} free GPU(s); {len(free)} of {len(known)} are free",
                        )
                    )
                    continue
                gpus = tuple(free[: req.gpus])
        engine = "llama-server" if target == "cuda" else req.engine
        need, refusal = memory_refusal(req, node, target, engine, gpus)
        if refusal is not None:
            out.skipped.append((node.name, refusal))
            continue
        try:
            release = release_for(engine, target)
        except BinaryError as exc:
            out.skipped.append((node.name, str(exc)))
            continue
        out.placements.append(Placement(node, release, gpus, existing.get(node.id), need))
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


# -- parallel placement groups ------------------------------------------------


@dataclass(frozen=True)
class ParallelRuntimes:
    """The parallel runtime for each target, as this cluster is configured."""

    vllm_version: str
    parallel_command: str | None = None  # launcher binary for cpu targets
    port_first: int = 20000
    port_last: int = 20999

    def release_for(self, target: str) -> Release:
        if target == "cuda":
            from letsinfer.engines.vllm import NOT_SUPERVISED

            # Planning and storing a group that every agent refuses would only
            # leave the model dark; refuse it here until agents can run it
            # (engines/vllm.py plans it, bound to the vllm package's bytes: vllm_release).
            raise StoreError(
                f"{NOT_SUPERVISED}; on cuda nodes install without --parallel (one "
                "llama-server group per node), or use --target cpu with [engine] "
                "parallel_command"
            )
        if self.parallel_command:
            return releases.parallel_command(self.parallel_command, target)
        raise StoreError(
            f"no parallel runtime for {target} targets: set [engine] parallel_command "
            "to a parallel-command launcher, or install without --parallel"
        )


@dataclass
class ParallelPlan:
    service: str
    release: Release
    tasks: list[tuple[NodeRecord, TaskSpec]] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)  # pg ids with a task on these nodes


def _data_address(node: NodeRecord) -> str:
    if node.role == "main" or not node.address:
        raise StoreError(
            f"{node.name}: the main's own agent does not prove data links yet; "
            "place parallel tasks on children"
        )
    return node.address.rsplit(":", 1)[0]


def plan_parallel(
    store: AuthorityStore,
    req: InstallRequest,
    runtimes: ParallelRuntimes,
    fresh_within_s: float,
) -> ParallelPlan:
    """One placement group with one task per node, or a StoreError saying why not.

    Core never invents parallelism: a single-device runtime is refused, and so
    is a group any one of whose nodes cannot take its task (the group is atomic).
    """
    if req.engine_explicit:
        raise StoreError(
            f"{req.engine} is a single-device runtime: core never splits it across "
            "nodes; install without --parallel (one placement group per node)"
        )
    svc = store.resolve_service(req.service)
    if svc is None:
        raise StoreError(f"no model {req.service!r}: add it first with `letsinfer model add`")
    if svc.is_external:
        raise StoreError(f"model {svc.name} is external: its provider serves it, not a node")
    if len(set(req.nodes)) < 2:
        raise StoreError("a parallel placement group needs two or more distinct nodes (--node)")
    if req.gpu_uuids:
        raise StoreError("--gpu names GPUs of one node; a parallel group takes --gpus per task")
    now = time.time()
    nodes: list[NodeRecord] = []
    for name in req.nodes:
        node = store.find_node(name)
        if node is None:
            raise StoreError(f"{name}: no such node")
        _data_address(node)
        if node.facts_at is None or now - node.facts_at > fresh_within_s:
            raise StoreError(f"{node.name}: unreachable: no fresh facts from its agent")
        if any(n.id == node.id for n in nodes):
            raise StoreError(f"{node.name} is named twice")
        nodes.append(node)
    targets = [_targets(n) for n in nodes]
    if req.target == "auto":
        target = "cuda" if all("cuda" in t for t in targets) else "cpu"
    else:
        target = req.target
    for node, offered in zip(nodes, targets, strict=True):
        if target not in offered:
            raise StoreError(f"{node.name} offers {', '.join(offered)}, not {target}")
    release = runtimes.release_for(target)
    if not releases.is_parallel(release):
        raise StoreError(f"release {release.id} is a single-device runtime; core never splits it")
    replaces = sorted(
        {
            t.pg_id
            for n in nodes
            for t in store.tasks_on_node(n.id)
            if (pg := store.get_placement_group(t.pg_id)) is not None and pg.service == svc.name
        }
    )
    out = ParallelPlan(service=svc.name, release=release, replaces=replaces)
    for i, node in enumerate(nodes):
        gpus: tuple[str, ...] = ()
        if target == "cuda":
            known = [g["uuid"] for g in (node.facts or {}).get("gpus", [])]
            held = store.gpus_in_use(node.id)
            for pg_id in replaces:
                held -= set(store.pg_gpus(pg_id))
            free = [g for g in known if g not in held]
            if len(free) < req.gpus:
                raise StoreError(
                    f"{node.name} needs {req.gpus} free GPU(s); {len(free)} of {len(known)} "
                    "are free"
                )
            gpus = tuple(free[: req.gpus])
            if req.shape is not None:
                # The parallel runtime splits the model over every GPU of every task.
                need = estimate(req.shape, release.engine, target, req.context, req.slots)
                devices = len(nodes) * req.gpus
                by_uuid = {g["uuid"]: g for g in (node.facts or {}).get("gpus", [])}
                refusal = gpu_refusal(need, [by_uuid[u] for u in gpus if u in by_uuid], devices)
                if refusal is not None:
                    raise StoreError(f"{node.name}: {refusal}")
        taken = store.task_ports_in_use(node.id)
        port = next(
            (p for p in range(runtimes.port_first, runtimes.port_last + 1) if p not in taken),
            None,
        )
        if port is None:
            raise StoreError(
                f"{node.name}: every task port {runtimes.port_first}-{runtimes.port_last} is taken"
            )
        out.tasks.append((node, TaskSpec(str(i), node.id, _data_address(node), port, gpus)))
    return out


def apply_parallel(
    store: AuthorityStore, p: ParallelPlan, sign: Callable[[Release], str], actor: str = "cli"
) -> str:
    r = p.release
    with store.transaction():
        for pg_id in p.replaces:
            store.delete_placement_group(pg_id)
        store.ensure_release(r.id, r.engine, r.version, r.target, r.artifacts, r.launch, sign(r))
        pg = store.add_parallel_placement_group(
            f"pg-{uuid.uuid4().hex[:12]}", p.service, r.id, r.target, [t for _, t in p.tasks]
        )
        store.append_audit(
            actor,
            "model.install",
            "ok",
            target=f"{p.service}@{'+'.join(n.name for n, _ in p.tasks)}",
            detail=f"{pg.id} {r.id} parallel tasks="
            + ",".join(
                f"{t.task}:{n.name}:{t.port}:{'|'.join(t.gpu_uuids) or '-'}" for n, t in p.tasks
            )
            + (f" replaces {','.join(p.replaces)}" if p.replaces else ""),
        )
    return pg.id
