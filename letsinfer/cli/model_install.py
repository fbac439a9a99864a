"""``letsinfer model install``: place a model on nodes, one placement group
each (or one parallel group), replacing what runs there only when asked; and
how a rollout's outcome is reported."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority import install as install_mod
from letsinfer.cli.local import ask_node, segment
from letsinfer.cli.model import model, refuse_adapter_name
from letsinfer.cli.model_add import gpus_option, show_plan, target_option
from letsinfer.cli.model_scale import checked_policy, said_policy, scale_options
from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.engines import releases
from letsinfer.fit.shape import ModelShape, ShapeError, read_shape
from letsinfer.release import runtime
from letsinfer.store import AuthorityStore, StoreError


@scoped(model, "install", scope="main")
@click.argument("name")
@click.option("--node", "nodes", multiple=True, help="A node to place it on; repeat for more.")
@target_option
@gpus_option
@click.option("--gpu", "gpu_uuids", multiple=True, help="Exact GPU UUID(s) to use.")
@click.option(
    "--engine",
    type=click.Choice(["xllamacpp", "llama-server"]),
    metavar="ENGINE",
    help="Engine for cpu targets: xllamacpp or llama-server (default: the configured one).",
)
@click.option(
    "--replace-existing",
    is_flag=True,
    help="Replace this model's placement group where a node already has one.",
)
@click.option(
    "--parallel",
    is_flag=True,
    help="ONE placement group with one task per --node, run by a parallel runtime "
    "(vLLM on cuda, [engine] parallel_command on cpu).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@scale_options
@click.pass_obj
def install(
    ctx: CliContext,
    name: str,
    nodes: tuple[str, ...],
    target: str,
    gpus: int,
    gpu_uuids: tuple[str, ...],
    engine: str | None,
    replace_existing: bool,
    parallel: bool,
    yes: bool,
    **scaling: Any,
) -> None:
    """Place a model on nodes: one placement group per node, each with the release
    qualified for that node's target and its exact GPUs (or, with --parallel, one
    group whose tasks span the nodes). The scaling options set its policy as
    `model scale` does, once it is placed."""
    assert ctx.identity is not None
    scale = checked_policy(scaling)
    settings = config.load(ctx.home.config_file)
    refuse_adapter_name(ctx, name, "install")
    store = open_authority(ctx.home)
    try:
        if parallel:
            _install_parallel(
                ctx,
                store,
                settings,
                install_mod.InstallRequest(
                    service=name,
                    nodes=nodes,
                    target=target,
                    gpus=gpus,
                    gpu_uuids=gpu_uuids,
                    engine=engine or settings.engine.kind,
                    parallel=True,
                    engine_explicit=engine is not None,
                ),
                replace_existing,
                yes,
            )
            said_policy(ctx, name, scale)
            return
        if not nodes:
            active = [n.name for n in store.list_nodes() if n.state == "active"]
            if not yes and not click.confirm(
                f"Replicate {name} on every active node ({', '.join(active)})?", default=True
            ):
                raise click.ClickException("name the nodes with --node (repeatable)")
            nodes = tuple(active)
        req = install_request(ctx, store, settings, name, nodes, target, gpus, gpu_uuids, engine)
        plan = install_mod.plan(
            store, req, settings.control.node_stale_after_s, ctx.identity.node_id
        )
        show_plan(plan)
        if not plan.placements:
            store.append_audit(
                "cli",
                "model.install",
                "denied",
                target=name,
                detail="; ".join(f"{n}: {w}" for n, w in plan.skipped),
            )
            reasons = "; ".join(f"{n}: {w}" for n, w in plan.skipped)
            raise click.ClickException(f"no node can take this model ({reasons}); nothing changed")
        if plan.replacing:
            _confirm_replacing(
                store,
                name,
                replace_existing,
                yes,
                f"{name} already runs on {', '.join(p.node.name for p in plan.replacing)}; "
                "pass --replace-existing to replace it. Nothing changed.",
            )

        def sign(r: releases.Release) -> str:
            return runtime.sign(ctx.home, r)

        fresh = install_mod.InstallPlan(
            plan.service, [p for p in plan.placements if not p.replaces]
        )
        created = install_mod.apply(store, fresh, sign) if fresh.placements else []
        replaced = _replace(ctx, store, plan, sign) if plan.replacing else None
    finally:
        store.close()
    if created:
        console.print(f"{len(created)} placement group(s) created: {', '.join(created)}")
    if replaced is not None:
        report_rollout(replaced)
    said_policy(ctx, plan.service, scale)


def _replace(
    ctx: CliContext,
    store: AuthorityStore,
    plan: install_mod.InstallPlan,
    sign: Callable[[releases.Release], str],
) -> dict[str, Any] | None:
    """Replacements go through the running node: each new group is proven
    before the one it replaces drains and goes (see lifecycle/rollout.py).
    With no node running nothing serves, so they are made directly."""
    for p in plan.replacing:
        r = p.release
        store.ensure_release(r.id, r.engine, r.version, r.target, r.artifacts, r.launch, sign(r))
    answer = ask_node(
        ctx.home,
        "POST",
        f"/v1/ops/models/{segment(plan.service)}/replace",
        json={
            "replacements": [
                {"group": p.replaces, "release": p.release.id, "gpus": list(p.gpus)}
                for p in plan.replacing
            ]
        },
        timeout=None,
    )
    if answer is not None:
        return answer
    made = install_mod.apply(store, install_mod.InstallPlan(plan.service, plan.replacing), sign)
    console.print(f"{len(made)} placement group(s) replaced: {', '.join(made)}")
    return None


def report_rollout(answer: dict[str, Any], as_json: bool = False) -> None:
    """Every group and what happened to it; exit 1 when one failed."""
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    for g in [] if as_json else answer["placement_groups"]:
        colour = {
            "upgraded": "green",
            "unchanged": "dim",
            "skipped": "yellow",
            "canary": "cyan",  # (letsinfer.lifecycle.canary)
            "aborted": "yellow",
        }.get(g["outcome"], "red")
        moved = f" (now {g['now']})" if g["now"] != g["group"] else ""
        detail = f": {g['detail']}" if g["detail"] else ""
        console.print(
            f"  {g['group']} on {g['node']}: [{colour}]{g['outcome']}[/{colour}]{moved} "
            f"{g['from']} -> {g['to']}{detail}",
            highlight=False,
        )
    if not answer["ok"]:
        failed = [
            f"{g['group']} on {g['node']}"
            for g in answer["placement_groups"]
            if g["outcome"] in ("restored", "failed", "gated")
        ]
        raise click.ClickException(
            f"{answer['action'].removeprefix('model.')} of {answer['model']} stopped: "
            f"{', '.join(failed)} failed"
        )


def model_shape(ctx: CliContext, store: AuthorityStore, name: str) -> ModelShape | None:
    """The model's shape from its file in the main's model store (for the memory fit)."""
    svc = store.resolve_service(name)
    if svc is None or svc.is_external:
        return None  # planning says "no model" (or "external") itself
    try:
        return read_shape(artifact_path(ctx.home.model_store, svc.artifact_digest))
    except ShapeError as exc:
        raise click.ClickException(
            f"{exc}: cannot check whether {svc.name} fits anywhere. Nothing changed."
        ) from exc


def install_request(
    ctx: CliContext,
    store: AuthorityStore,
    settings: config.Settings,
    name: str,
    nodes: tuple[str, ...],
    target: str,
    gpus: int,
    gpu_uuids: tuple[str, ...],
    engine: str | None,
) -> install_mod.InstallRequest:
    """What `model install` and `model plan` both ask the one planner."""
    return install_mod.InstallRequest(
        service=name,
        nodes=nodes,
        target=target,
        gpus=gpus,
        gpu_uuids=gpu_uuids,
        engine=engine or settings.engine.kind,
        llama_server_binary=settings.engine.llama_server_binary,
        shape=model_shape(ctx, store, name),
        context=settings.engine.context,
        slots=settings.engine.parallel,
    )


def _install_parallel(
    ctx: CliContext,
    store: AuthorityStore,
    settings: config.Settings,
    req: install_mod.InstallRequest,
    replace_existing: bool,
    yes: bool,
) -> None:
    engine = settings.engine
    req = replace(
        req,
        shape=model_shape(ctx, store, req.service),
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
        store.append_audit("cli", "model.install", "denied", target=req.service, detail=str(exc))
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    for node, t in plan.tasks:
        gpus_text = f" on {', '.join(t.gpu_uuids)}" if t.gpu_uuids else ""
        role = "head" if t.task == "0" else "worker"
        console.print(
            f"  [green]task {t.task}[/green] ({role}) {node.name} {t.address}:{t.port}: "
            f"{plan.release.id}{gpus_text}"
        )
    if plan.replaces:
        _confirm_replacing(
            store,
            req.service,
            replace_existing,
            yes,
            f"{req.service} already has placement group(s) {', '.join(plan.replaces)} on "
            "these nodes; pass --replace-existing to replace them. Nothing changed.",
        )
    pg_id = install_mod.apply_parallel(store, plan, lambda r: runtime.sign(ctx.home, r))
    console.print(
        f"1 parallel placement group created: {pg_id} ({len(plan.tasks)} tasks); its endpoint "
        "is published when every task is ready and every data link is proven"
    )


def _confirm_replacing(
    store: AuthorityStore, service: str, replace_existing: bool, yes: bool, refusal: str
) -> None:
    """Replacing running groups needs --replace-existing or an interactive yes;
    otherwise it is refused (audited) before anything changes."""
    if replace_existing or (not yes and click.confirm("Replace the existing placement groups?")):
        return
    store.append_audit(
        "cli",
        "model.install",
        "denied",
        target=service,
        detail="would replace without --replace-existing",
    )
    raise click.ClickException(refusal)
