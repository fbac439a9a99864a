"""``letsinfer model``: the model services this cluster serves."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from letsinfer import config
from letsinfer.authority import install as install_mod
from letsinfer.authority import lifecycle
from letsinfer.authority.anchor import open_authority
from letsinfer.authority.links import ResumeRefused, resume_model
from letsinfer.authority.models import FirstGroup, add_gguf_model
from letsinfer.cli import cli, settling
from letsinfer.cli.local import ask_node, segment
from letsinfer.cli.model_external import (
    add_external,
    external_options,
    show_external,
)
from letsinfer.cli.output import brief, console, emit, emit_object
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.cli.shown import read_scene, read_store
from letsinfer.cli.views import model_object
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.engines import releases
from letsinfer.engines.binary import BinaryError
from letsinfer.fit.estimate import size_text
from letsinfer.fit.shape import ModelShape, ShapeError, read_shape
from letsinfer.lifecycle.door import Door
from letsinfer.release import runtime
from letsinfer.storage import refetch
from letsinfer.store import AuthorityStore, ServiceRecord, StoreError


@cli.group()
def model() -> None:
    """Model services: add, pull, place, start, stop, upgrade, remove.

    A model service is the name clients ask for; it runs as one or more
    placement groups (an engine on a node's GPUs or CPU)."""


@scoped(model, "list", scope="main")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_models(ctx: CliContext, as_json: bool) -> None:
    """List model services with their state and placement groups."""
    store = read_store(ctx.home)
    try:
        scene = read_scene(ctx, store)
        rows = [model_object(store, scene, svc) for svc in store.list_services()]
    finally:
        store.close()
    if as_json:
        emit(rows, [], as_json=True)
        return
    table = [
        {
            **r,
            "aliases": ", ".join(r["aliases"]),
            "sha256": brief(r["sha256"], 12) if not r["external"] else "-",
            # An external model has no file and no placement groups: its state
            # is the gateway's (serving while it publishes it), its size none.
            "size": f"{r['size'] / 1e6:.1f} MB" if not r["external"] else "-",
            "from": (
                r["external"]["url"]
                if r["external"]
                else f"{r['repo']}@{brief(r['commit'], 12)}"
                if r["repo"]
                else "file"
            ),
            "ready": f"{r['ready']}/{r['total']}" if not r["external"] else "external",
        }
        for r in rows
    ]
    emit(
        table,
        ["name", "aliases", "state", "ready", "format", "size", "sha256", "from"],
        as_json=False,
        title="models",
    )


def placement_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Where `model add` and `model pull` serve what they add: the planner of
    `model install` picks the target and GPUs and checks the memory fit."""
    for option in reversed(
        (
            click.option(
                "--node",
                "nodes",
                multiple=True,
                help="A node to serve it on; repeat for more (default: this node, the main).",
            ),
            click.option(
                "--target",
                type=click.Choice(["auto", "cpu", "cuda"]),
                default="auto",
                show_default=True,
                help="auto: cuda where the node has GPUs, else cpu.",
            ),
            click.option(
                "--gpus",
                default=1,
                show_default=True,
                type=click.IntRange(min=1),
                help="GPUs per placement group on a cuda target.",
            ),
        )
    ):
        command = option(command)
    return command


@dataclass(frozen=True)
class Where:
    """What `--node`, `--target` and `--gpus` asked for."""

    nodes: tuple[str, ...] = ()
    target: str = "auto"
    gpus: int = 1

    def refuse_with_no_serve(self, no_serve: bool) -> None:
        if no_serve and (self.nodes or self.target != "auto" or self.gpus != 1):
            raise click.UsageError("--node, --target and --gpus place a model; --no-serve does not")


@scoped(model, "add", scope="main")
@click.argument("name")
@click.option(
    "--gguf",
    "gguf_path",
    type=click.Path(path_type=Path),
    help="A local GGUF file; it is checked and copied into the model store.",
)
@click.option("--alias", "aliases", multiple=True, help="Another name clients may use.")
@click.option(
    "--engine",
    type=click.Choice(["xllamacpp", "llama-server"]),
    help="Engine to run it (default: the node's configured engine).",
)
@click.option(
    "--no-serve",
    is_flag=True,
    help="Only register it; place it later with `letsinfer model install`.",
)
@external_options
@click.option(
    "--fallback",
    metavar="MODEL",
    help="The model that answers when none of this one's groups can (parked, stopped, "
    "full past the queue's wait, failing before the first byte).",
)
@placement_options
@click.pass_obj
def add_model(
    ctx: CliContext,
    name: str,
    gguf_path: Path | None,
    aliases: tuple[str, ...],
    engine: str | None,
    no_serve: bool,
    fallback: str | None,
    nodes: tuple[str, ...],
    target: str,
    gpus: int,
    **external: Any,
) -> None:
    """Add a model from a local GGUF file and serve it where it fits (this node by
    default, --node to choose), or publish an OpenAI-compatible provider's model
    under NAME (--external)."""
    where = Where(nodes, target, gpus)
    if (gguf_path is None) == (external["url"] is None):
        raise click.UsageError("give exactly one of --gguf FILE or --external URL")
    if external["url"] is not None:
        if engine or no_serve or where != Where():
            raise click.UsageError(
                "--engine, --no-serve, --node, --target and --gpus are for --gguf models"
            )
        add_external(ctx, name, aliases, fallback, **external)
        return
    if any(v is not None for k, v in external.items() if k != "url"):
        raise click.UsageError(
            "--provider-model, --key-file, --ca-file and --concurrency are for --external"
        )
    assert gguf_path is not None
    where.refuse_with_no_serve(no_serve)
    admit_gguf(
        ctx, name, gguf_path.expanduser(), aliases, engine, no_serve, where, fallback=fallback
    )


def admit_gguf(
    ctx: CliContext,
    name: str,
    gguf_path: Path,
    aliases: tuple[str, ...],
    engine: str | None,
    no_serve: bool,
    where: Where,
    origin: dict[str, Any] | None = None,
    fallback: str | None = None,
) -> ServiceRecord:
    """The one way a model file enters the model store and the authority: `model
    add --gguf` and `model pull` (with the file's ``origin``) both come here.
    Unless ``no_serve``, the install planner places it (where it fits) before
    any engine loads it; where it fits nowhere, nothing changes."""
    assert ctx.identity is not None  # the scope check guarantees an identity
    identity = ctx.identity
    settings = config.load(ctx.home.config_file)
    try:
        release = releases.for_engine_kind(
            engine or settings.engine.kind, settings.engine.llama_server_binary
        )
    except BinaryError as exc:
        raise click.ClickException(
            f"cannot release the llama-server binary: {exc}. Nothing changed."
        ) from exc
    store = open_authority(ctx.home)
    refused: list[StoreError] = []  # the planner's own refusal (said with "Nothing changed.")

    def place(path: Path) -> list[FirstGroup]:
        try:
            shape = read_shape(path)
        except ShapeError as exc:
            refused.append(
                StoreError(
                    f"{exc}: cannot check whether {name} fits anywhere "
                    "(--no-serve registers it without placing it)"
                )
            )
            raise refused[-1] from exc
        req = install_mod.InstallRequest(
            service=name,
            nodes=where.nodes or (identity.name,),
            target=where.target,
            gpus=where.gpus,
            engine=engine or settings.engine.kind,
            llama_server_binary=settings.engine.llama_server_binary,
            shape=shape,
            context=settings.engine.context,
            slots=settings.engine.parallel,
        )
        found = install_mod.plan_groups(
            store, req, settings.control.node_stale_after_s, identity.node_id
        )
        show_plan(found)
        if not found.placements:
            reasons = "; ".join(f"{n}: {w}" for n, w in found.skipped)
            refused.append(StoreError(f"no node can take model {name!r} ({reasons})"))
            raise refused[-1]
        return [
            FirstGroup(p.node.id, p.release, runtime.sign(ctx.home, p.release), p.gpus)
            for p in found.placements
        ]

    try:
        svc, pgs = add_gguf_model(
            store,
            ctx.home.model_store,
            name,
            gguf_path,
            release=release,
            place=None if no_serve else place,
            aliases=aliases,
            release_signature=runtime.sign(ctx.home, release),
            origin=origin,
            door=Door(
                threads=settings.engine.threads,
                ready_timeout_s=settings.engine.ready_timeout_s,
                ports=(settings.engine.port_first, settings.engine.port_last),
            ),
            fallback=fallback,
        )
        nodes = {n.id: n.name for n in store.list_nodes()}
    except StoreError as exc:
        if exc not in refused:
            raise
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    finally:
        store.close()
    where_text = (
        "; ".join(
            f"placement group {pg.id} on {nodes.get(pg.node_id, pg.node_id)} with {pg.release_id}"
            for pg in pgs
        )
        if pgs
        else "not placed yet (`letsinfer model install`)"
    )
    console.print(
        f"added model [bold]{svc.name}[/bold] (sha256:{svc.artifact_digest[:12]}, "
        f"{svc.artifact_size / 1e6:.1f} MB); {where_text}"
    )
    return svc


def show_plan(plan: install_mod.InstallPlan) -> None:
    """Each placement a plan makes, and each node it skips with why."""
    for p in plan.placements:
        gpus_text = f" on {', '.join(p.gpus)}" if p.gpus else ""
        note = f" (replaces {p.replaces})" if p.replaces else ""
        fit = f", needs {fit_text(p)}" if p.need else ""
        console.print(
            f"  [green]install[/green] {p.node.name}: {p.release.id}{gpus_text}{fit}{note}"
        )
    for node_name, why in plan.skipped:
        console.print(f"  [yellow]skip[/yellow]    {node_name}: {why}")


@scoped(model, "install", scope="main")
@click.argument("name")
@click.option("--node", "nodes", multiple=True, help="A node to place it on; repeat for more.")
@click.option(
    "--target",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="auto: cuda where the node has GPUs, else cpu.",
)
@click.option(
    "--gpus",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="GPUs per placement group on a cuda target.",
)
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
) -> None:
    """Place a model on nodes: one placement group per node, each with the release
    qualified for that node's target and its exact GPUs (or, with --parallel, one
    group whose tasks span the nodes)."""
    assert ctx.identity is not None
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
        colour = {"upgraded": "green", "unchanged": "dim", "skipped": "yellow"}.get(
            g["outcome"], "red"
        )
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
            if g["outcome"] in ("restored", "failed")
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


def fit_text(p: install_mod.Placement) -> str:
    assert p.need is not None
    where = (
        f"per GPU of {len(p.gpus)}"
        if len(p.gpus) > 1
        else ("of GPU memory" if p.gpus else "of RAM")
    )
    return f"{size_text(p.need.on(max(len(p.gpus), 1)))} {where}"


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


def refuse_adapter_name(ctx: CliContext, name: str, verb: str) -> None:
    """Refuse `model VERB ADAPTER` saying what the name is (the authority would
    only say there is no such model)."""
    store = read_store(ctx.home)
    try:
        why = adapter_refusal(store, name)
    finally:
        store.close()
    if why is not None:
        raise click.ClickException(f"{why} (`letsinfer model {verb}` takes its base model)")


# How long `model stop` waits for engines to be gone: a child's agent reports
# it with its next facts, an engine stops within seconds of SIGTERM.
STOP_WAIT_S = 60.0


def _set_desired(ctx: CliContext, name: str, desired: str) -> str:
    """Ask for it (the running node, else the authority directly); the model's
    canonical name."""
    verb = "start" if desired == "running" else "stop"
    refuse_adapter_name(ctx, name, verb)
    answer = ask_node(ctx.home, "POST", f"/v1/ops/models/{segment(name)}/{verb}")
    if answer is None:  # no node runs here: write the authority directly
        store = open_authority(ctx.home)
        try:
            answer = lifecycle.set_model_desired(store, name, desired, actor="cli").to_json()
            if desired == "running":
                answer["downloads"] = refetch.downloads(store, answer["model"])
        finally:
            store.close()
    for d in answer.get("downloads", []):  # its file was released there (`node cleanup`)
        console.print(
            f"{d['node']} downloads sha256:{d['artifact']} again and verifies it "
            "before its placement group serves",
            soft_wrap=True,
        )
    return str(answer["model"])


def report_model(now: settling.ModelNow) -> None:
    """The model's state and each group's, as `model show` shows them."""
    console.print(f"model {now.model}: {now.state}", highlight=False)
    if now.state == "not placed":
        console.print(
            f"  no placement group runs it: `letsinfer model install {now.model}` places it",
            highlight=False,
        )
    for g in now.groups:
        why = f": {g.detail}" if g.detail and g.state not in ("ready", "stopped") else ""
        console.print(f"  {g.id} on {g.node}: {g.state}{why}", highlight=False)


@scoped(model, "stop", scope="main")
@click.argument("name")
@click.pass_obj
def stop(ctx: CliContext, name: str) -> None:
    """Stop every placement group of a model (engines stop; nothing is deleted).

    Returns once every group's engine is gone (or says which are still
    stopping after a minute)."""
    model_name = _set_desired(ctx, name, "stopped")
    now = settling.settle(ctx, model_name, lambda m: m.settled, STOP_WAIT_S)
    report_model(now)


@scoped(model, "start", scope="main")
@click.argument("name")
@click.option(
    "--wait",
    is_flag=True,
    help="Return once every placement group is ready, or has stopped trying "
    "(parked, failed), within [lifecycle] start_timeout_s.",
)
@click.pass_obj
def start(ctx: CliContext, name: str, wait: bool) -> None:
    """Start a model's placement groups again (parked ones start afresh).

    Without --wait it returns at once and says which groups are still
    starting; until one is ready, requests for the model get 503
    no_healthy_replica (retry shortly)."""
    model_name = _set_desired(ctx, name, "running")
    if not wait:
        now = settling.model_now(ctx, model_name)
        report_model(now)
        if not now.settled:
            console.print(
                f"`letsinfer model start {model_name} --wait` waits until it serves",
                highlight=False,
            )
        return
    timeout = config.load(ctx.home.config_file).lifecycle.start_timeout_s
    now = settling.settle(ctx, model_name, lambda m: m.settled, timeout)
    report_model(now)
    if now.state != "serving":
        raise click.ClickException(
            f"model {model_name} is {now.state}"
            + (f" after {timeout:.0f}s" if not now.settled else "")
        )


@scoped(model, "resume", scope="main")
@click.argument("name")
@click.pass_obj
def resume(ctx: CliContext, name: str) -> None:
    """Resume placement groups paused by a lost data link (an explicit step), once
    every link they need is proven again; also starts stopped groups."""
    refuse_adapter_name(ctx, name, "resume")
    answer = ask_node(ctx.home, "POST", f"/v1/ops/models/{segment(name)}/resume")
    if answer is None:
        store = open_authority(ctx.home)
        try:
            done = resume_model(store, name, actor="cli")
        except ResumeRefused as exc:
            raise click.ClickException(f"{exc}. Nothing changed.") from exc
        finally:
            store.close()
        answer = done.to_json()
    unpaused = answer["unpaused"]
    if unpaused:
        console.print(f"unpaused: {', '.join(unpaused)}", highlight=False)
    report_model(settling.model_now(ctx, answer["model"]))


@scoped(model, "show", scope="main")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (one object).")
@click.pass_obj
def show(ctx: CliContext, name: str, as_json: bool) -> None:
    """One model: its artifact, state and every placement group with release, GPUs
    and state."""
    store = read_store(ctx.home)
    try:
        svc = store.resolve_service(name)
        if svc is None:
            raise StoreError(adapter_refusal(store, name) or f"no model {name!r}")
        info = model_object(store, read_scene(ctx, store), svc)
    finally:
        store.close()
    if as_json:
        emit_object(info)
        return
    if svc.is_external:
        console.print(f"[bold]{svc.name}[/bold] external: {info['state']}", highlight=False)
    else:
        console.print(
            f"[bold]{svc.name}[/bold] sha256:{brief(svc.artifact_digest, 16)} "
            f"{svc.artifact_size / 1e6:.1f} MB: {info['state']}, "
            f"{info['ready']}/{info['total']} placement group(s) ready",
            highlight=False,
        )
    show_external(info)
    if info["repo"]:
        console.print(f"  repo     {info['repo']} (revision {info['revision']})")
        console.print(f"  commit   {info['commit']}")
        for f in info["files"]:
            console.print(f"  file     {f['name']} sha256:{f['sha256']}")
    pgs = info["placement_groups"]
    emit(
        [{**p, "gpus": ", ".join(p["gpus"])} for p in pgs],
        ["id", "node", "release", "gpus", "desired", "state", "endpoint"],
        as_json=False,
        title="placement groups",
    )
    for p in pgs:
        if p["state"] in ("parked", "failed") and p["detail"]:
            console.print(f"[red]{p['id']} {p['state']}[/red]: {p['detail']}", highlight=False)
    kept = list(dict.fromkeys(h["release"] for h in info["releases"]))
    if kept:
        console.print(f"releases it ran (rollback targets): {', '.join(kept)}", highlight=False)
