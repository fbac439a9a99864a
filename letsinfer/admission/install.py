"""`model install`: a model placed on nodes by the install planner, each
question it raises (every active node? replace what runs there?) answered
by whoever runs it: the CLI on the main asks at its terminal; a
controller's request carries its answers (--yes, --replace-existing) and,
without them, is told what would happen and refused, as the CLI is with
--yes. One function for the CLI on the main and the admin API: it says what
the CLI prints. New groups are made here; replacements are rolled out by
the caller, through the running main's gateway (each new group proven
before the one it replaces drains)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from letsinfer import config
from letsinfer.admission.gguf import Refused, show_plan
from letsinfer.admission.said import Say
from letsinfer.authority import install as install_mod
from letsinfer.authority.views import adapter_named
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.engines import releases
from letsinfer.fit.shape import ModelShape, ShapeError, read_shape
from letsinfer.home import Home
from letsinfer.release import runtime
from letsinfer.store import AuthorityStore, StoreError

# (question, default) -> the answer; None where no one can be asked.
Confirm = Callable[[str, bool], bool]


@dataclass(frozen=True)
class InstallAsk:
    name: str
    nodes: tuple[str, ...] = ()  # none: every active node, once agreed to
    target: str = "auto"
    gpus: int = 1
    gpu_uuids: tuple[str, ...] = ()
    engine: str | None = None  # None: the configured one
    replace_existing: bool = False
    parallel: bool = False
    yes: bool = False  # agreed in advance to every active node (and asked nothing)


@dataclass
class Installed:
    """What was made; ``replacing``: the groups still to replace, their
    releases recorded (the caller rolls them out)."""

    model: str
    created: list[str] = field(default_factory=list)
    replacing: install_mod.InstallPlan | None = None

    def replacements(self) -> list[dict[str, Any]]:
        """The rollout's body (letsinfer.control.ops.rollouts.Replace)."""
        assert self.replacing is not None
        return [
            {"group": p.replaces, "release": p.release.id, "gpus": list(p.gpus)}
            for p in self.replacing.placements
        ]


def install_model(
    home: Home,
    store: AuthorityStore,
    main_node_id: str,
    say: Say,
    ask: InstallAsk,
    confirm: Confirm | None,
    *,
    actor: str = "cli",
    role: str | None = None,
) -> Installed:
    """Refused (audited where the planner refused it), or StoreError: nothing
    changed."""
    settings = config.load(home.config_file)
    why = adapter_named(store, ask.name, "install")
    if why is not None:
        raise Refused(why)
    if ask.parallel:
        return _install_parallel(home, store, settings, say, ask, confirm, actor, role)
    nodes = ask.nodes
    if not nodes:
        active = [n.name for n in store.list_nodes() if n.state == "active"]
        question = f"Replicate {ask.name} on every active node ({', '.join(active)})?"
        if not ask.yes:
            if confirm is None:
                raise Refused(
                    f"{question} Nothing asks from a controller: pass --yes to replicate "
                    "it there, or name the nodes with --node (repeatable). Nothing changed."
                )
            if not confirm(question, True):
                raise Refused("name the nodes with --node (repeatable)")
        nodes = tuple(active)
    req = install_mod.InstallRequest(
        service=ask.name,
        nodes=nodes,
        target=ask.target,
        gpus=ask.gpus,
        gpu_uuids=ask.gpu_uuids,
        engine=ask.engine or settings.engine.kind,
        llama_server_binary=settings.engine.llama_server_binary,
        shape=_model_shape(home, store, ask.name),
        context=settings.engine.context,
        slots=settings.engine.parallel,
    )
    plan = install_mod.plan(store, req, settings.control.node_stale_after_s, main_node_id)
    show_plan(say, plan)
    if not plan.placements:
        reasons = "; ".join(f"{n}: {w}" for n, w in plan.skipped)
        store.append_audit(
            actor, "model.install", "denied", role=role, target=ask.name, detail=reasons
        )
        raise Refused(f"no node can take this model ({reasons}); nothing changed")
    if plan.replacing:
        _agree_to_replace(
            store,
            ask,
            confirm,
            actor,
            role,
            f"{ask.name} already runs on {', '.join(p.node.name for p in plan.replacing)}; "
            "pass --replace-existing to replace it. Nothing changed.",
        )

    def sign(r: releases.Release) -> str:
        return runtime.sign(home, r)

    fresh = install_mod.InstallPlan(plan.service, [p for p in plan.placements if not p.replaces])
    done = Installed(plan.service)
    if fresh.placements:
        done.created = install_mod.apply(store, fresh, sign, actor)
    if plan.replacing:
        for p in plan.replacing:
            r = p.release
            store.ensure_release(
                r.id, r.engine, r.version, r.target, r.artifacts, r.launch, sign(r)
            )
        done.replacing = install_mod.InstallPlan(plan.service, plan.replacing)
    return done


def replace_directly(
    home: Home, store: AuthorityStore, installed: Installed, say: Say, actor: str = "cli"
) -> None:
    """Where no node runs (nothing serves): the replacements made at once."""
    assert installed.replacing is not None
    made = install_mod.apply(store, installed.replacing, lambda r: runtime.sign(home, r), actor)
    say(f"{len(made)} placement group(s) replaced: {', '.join(made)}")


def _model_shape(home: Home, store: AuthorityStore, name: str) -> ModelShape | None:
    """The model's shape from its file in the main's model store (for the memory fit)."""
    svc = store.resolve_service(name)
    if svc is None or svc.is_external:
        return None  # planning says "no model" (or "external") itself
    try:
        return read_shape(artifact_path(home.model_store, svc.artifact_digest))
    except ShapeError as exc:
        raise Refused(
            f"{exc}: cannot check whether {svc.name} fits anywhere. Nothing changed."
        ) from exc


def _install_parallel(
    home: Home,
    store: AuthorityStore,
    settings: config.Settings,
    say: Say,
    ask: InstallAsk,
    confirm: Confirm | None,
    actor: str,
    role: str | None,
) -> Installed:
    engine = settings.engine
    req = install_mod.InstallRequest(
        service=ask.name,
        nodes=ask.nodes,
        target=ask.target,
        gpus=ask.gpus,
        gpu_uuids=ask.gpu_uuids,
        engine=ask.engine or engine.kind,
        parallel=True,
        engine_explicit=ask.engine is not None,
    )
    req = replace(
        req,
        shape=_model_shape(home, store, req.service),
        context=engine.context,
        slots=engine.parallel,
    )
    runtimes = install_mod.ParallelRuntimes(
        vllm_version=engine.vllm_version,
        parallel_command=engine.parallel_command,
        port_first=engine.task_port_first,
        port_last=engine.task_port_last,
    )
    try:
        plan = install_mod.plan_parallel(store, req, runtimes, settings.control.node_stale_after_s)
    except StoreError as exc:
        store.append_audit(
            actor, "model.install", "denied", role=role, target=req.service, detail=str(exc)
        )
        raise Refused(f"{exc}. Nothing changed.") from exc
    for node, t in plan.tasks:
        gpus_text = f" on {', '.join(t.gpu_uuids)}" if t.gpu_uuids else ""
        task_role = "head" if t.task == "0" else "worker"
        say(
            f"  [green]task {t.task}[/green] ({task_role}) {node.name} {t.address}:{t.port}: "
            f"{plan.release.id}{gpus_text}"
        )
    if plan.replaces:
        _agree_to_replace(
            store,
            ask,
            confirm,
            actor,
            role,
            f"{req.service} already has placement group(s) {', '.join(plan.replaces)} on "
            "these nodes; pass --replace-existing to replace them. Nothing changed.",
        )
    pg_id = install_mod.apply_parallel(store, plan, lambda r: runtime.sign(home, r), actor)
    say(
        f"1 parallel placement group created: {pg_id} ({len(plan.tasks)} tasks); its endpoint "
        "is published when every task is ready and every data link is proven"
    )
    return Installed(ask.name)


def _agree_to_replace(
    store: AuthorityStore,
    ask: InstallAsk,
    confirm: Confirm | None,
    actor: str,
    role: str | None,
    refusal: str,
) -> None:
    """Replacing running groups needs --replace-existing or a yes at the
    terminal (never from --yes, nor from a controller); otherwise it is
    refused (audited) before anything changes."""
    if ask.replace_existing:
        return
    if (
        not ask.yes
        and confirm is not None
        and confirm("Replace the existing placement groups?", False)
    ):
        return
    store.append_audit(
        actor,
        "model.install",
        "denied",
        role=role,
        target=ask.name,
        detail="would replace without --replace-existing",
    )
    raise Refused(refusal)
