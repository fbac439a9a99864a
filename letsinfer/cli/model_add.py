"""``letsinfer model add``: a local GGUF file or an external provider's
model, checked, proven and placed; and how a placement plan is shown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from letsinfer.admission import gguf
from letsinfer.admission.gguf import fit_text
from letsinfer.authority import install as install_mod
from letsinfer.bundle.progress import Silent
from letsinfer.cli.model import model
from letsinfer.cli.model_external import (
    add_external,
    external_options,
)
from letsinfer.cli.model_scale import checked_policy, said_policy, scale_options
from letsinfer.cli.remote import NoRemoteOperation, call
from letsinfer.cli.said import say_here
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.store import ServiceRecord

__all__ = ["Where", "admit_gguf", "fit_text", "placement_options", "show_plan"]

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
class Where(gguf.Where):
    """What `--node`, `--target` and `--gpus` asked for."""

    def refuse_on_demand(self) -> None:
        if self != Where():
            raise click.UsageError(
                "--min 0 loads the model where it fits at its first request; --node, "
                "--target and --gpus place it now"
            )

    def refuse_with_no_serve(self, no_serve: bool) -> None:
        if no_serve and (self.nodes or self.target != "auto" or self.gpus != 1):
            raise click.UsageError("--node, --target and --gpus place a model; --no-serve does not")


@scoped(model, "add", scope="main", remote="operator")
@click.argument("name")
@click.option(
    "--gguf",
    "gguf_path",
    type=click.Path(path_type=Path),
    help="A local GGUF file; it is checked and copied into the model store. From a "
    "paired controller: the absolute path of a file on the main, under its model store, "
    "its mirror or a directory [control] add_from lists (nothing is uploaded).",
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
    if ctx.remote is not None and external["url"] is not None:
        raise NoRemoteOperation(
            "`model add --external` has no operation in the admin API yet (its key file "
            "would have to travel); nothing was sent. Run it on the main itself."
        )
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
    if ctx.remote is not None:  # a file the main has: nothing is uploaded
        call(
            ctx.remote,
            "POST",
            "/v1/ops/models/add",
            {
                "name": name,
                "gguf": str(gguf_path),
                "aliases": list(aliases),
                "engine": engine,
                "no_serve": no_serve or on_demand,
                "fallback": fallback,
                "nodes": list(nodes),
                "target": target,
                "gpus": gpus,
            },
            timeout=None,
            shown=Silent(),  # no steps to show: what it says, as it says it
        )
    else:
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
    """The one way a model file enters the model store and the authority
    (letsinfer.admission.gguf), from the CLI on the main."""
    assert ctx.identity is not None  # the scope check guarantees an identity
    try:
        return gguf.admit_gguf(
            ctx.home,
            ctx.identity,
            say_here,
            name,
            gguf_path,
            aliases,
            engine,
            no_serve,
            where,
            origin=origin,
            fallback=fallback,
        )
    except gguf.Refused as exc:
        raise click.ClickException(str(exc)) from exc


def show_plan(plan: install_mod.InstallPlan) -> None:
    """Each placement a plan makes, and each node it skips with why."""
    gguf.show_plan(say_here, plan)
