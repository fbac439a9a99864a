"""``letsinfer model add``: a local GGUF file or an external provider's
model, checked, proven and placed; and how a placement plan is shown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority import install as install_mod
from letsinfer.authority.models import FirstGroup, add_gguf_model
from letsinfer.cli.model import model
from letsinfer.cli.model_external import (
    add_external,
    external_options,
)
from letsinfer.cli.model_scale import checked_policy, said_policy, scale_options
from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.engines import releases
from letsinfer.engines.binary import BinaryError
from letsinfer.fit.estimate import size_text
from letsinfer.fit.shape import ShapeError, read_shape
from letsinfer.lifecycle.door import Door, prover
from letsinfer.release import runtime
from letsinfer.store import ServiceRecord, StoreError

# Where a model goes: `model add`, `pull`, `install` and `plan` ask it alike.
target_option = click.option(
    "--target",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="auto: cuda where the node has GPUs, else cpu.",
)
gpus_option = click.option(
    "--gpus",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="GPUs per placement group on a cuda target.",
)


def placement_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Where `model add` and `model pull` serve what they add: the planner of
    `model install` picks the target and GPUs and checks the memory fit."""
    node = click.option(
        "--node",
        "nodes",
        multiple=True,
        help="A node to serve it on; repeat for more (default: this node, the main).",
    )
    return node(target_option(gpus_option(command)))


@dataclass(frozen=True)
class Where:
    """What `--node`, `--target` and `--gpus` asked for."""

    nodes: tuple[str, ...] = ()
    target: str = "auto"
    gpus: int = 1

    def refuse_on_demand(self) -> None:
        if self != Where():
            raise click.UsageError(
                "--min 0 loads the model where it fits at its first request; --node, "
                "--target and --gpus place it now"
            )

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
@scale_options
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
    min_groups: int | None,
    max_groups: int | None,
    idle_s: float | None,
    min_resident_s: float | None,
    target_inflight: float | None,
    scale_down_s: float | None,
    **external: Any,
) -> None:
    """Add a model from a local GGUF file and serve it where it fits (this node by
    default, --node to choose), or publish an OpenAI-compatible provider's model
    under NAME (--external). With `--min 0` it is registered now and loaded
    at its first request (see `model scale`)."""
    where = Where(nodes, target, gpus)
    scale = checked_policy(
        dict(
            min_groups=min_groups,
            max_groups=max_groups,
            idle_s=idle_s,
            min_resident_s=min_resident_s,
            target_inflight=target_inflight,
            scale_down_s=scale_down_s,
        )
    )
    if (gguf_path is None) == (external["url"] is None):
        raise click.UsageError("give exactly one of --gguf FILE or --external URL")
    if external["url"] is not None:
        if engine or no_serve or where != Where() or scale:
            raise click.UsageError(
                "--engine, --no-serve, --node, --target, --gpus and the scaling options "
                "are for --gguf models"
            )
        add_external(ctx, name, aliases, fallback, **external)
        return
    if any(v is not None for k, v in external.items() if k != "url"):
        raise click.UsageError(
            "--provider-model, --key-file, --ca-file and --concurrency are for --external"
        )
    assert gguf_path is not None
    where.refuse_with_no_serve(no_serve)
    on_demand = scale.get("min_groups") == 0
    if on_demand:
        where.refuse_on_demand()
    admit_gguf(
        ctx,
        name,
        gguf_path.expanduser(),
        aliases,
        engine,
        no_serve or on_demand,
        where,
        fallback=fallback,
    )
    said_policy(ctx, name, scale)


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
            prove=prover(
                release,
                Door(
                    threads=settings.engine.threads,
                    ready_timeout_s=settings.engine.ready_timeout_s,
                    ports=(settings.engine.port_first, settings.engine.port_last),
                ),
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


def fit_text(p: install_mod.Placement) -> str:
    assert p.need is not None
    where = (
        f"per GPU of {len(p.gpus)}"
        if len(p.gpus) > 1
        else ("of GPU memory" if p.gpus else "of RAM")
    )
    return f"{size_text(p.need.on(max(len(p.gpus), 1)))} {where}"
