"""``letsinfer model install``: place a model on nodes, one placement group
each (or one parallel group), replacing what runs there only when asked; and
how a rollout's outcome is reported."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from letsinfer.cli.local import segment
from letsinfer.cli.model import model
from letsinfer.cli.model_add import gpus_option, target_option
from letsinfer.cli.model_scale import checked_policy, said_policy, scale_options
from letsinfer.cli.output import console
from letsinfer.cli.remote import ask_main
from letsinfer.cli.scope import CliContext, scoped

if TYPE_CHECKING:
    from letsinfer.admission.install import InstallAsk


@scoped(model, "install", scope="main", remote="operator")
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
@click.option(
    "--yes",
    is_flag=True,
    help="Do not ask for confirmation (with no --node: every active node). From a "
    "controller nothing asks: without --node, give --yes.",
)
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
    from letsinfer.admission.install import InstallAsk

    scale = checked_policy(scaling)
    ask = InstallAsk(name, nodes, target, gpus, gpu_uuids, engine, replace_existing, parallel, yes)
    if ctx.remote is not None:  # planned and made on the main, replaced on its loop
        from letsinfer.cli.said import replay

        answer = ask_main(
            ctx,
            "POST",
            f"/v1/ops/models/{segment(name)}/install",
            {
                "nodes": list(nodes),
                "target": target,
                "gpus": gpus,
                "gpu_uuids": list(gpu_uuids),
                "engine": engine,
                "replace_existing": replace_existing,
                "parallel": parallel,
                "yes": yes,
            },
            timeout=None,
        )
        replay(answer["said"])
        placed, created, replaced = answer["model"], answer["created"], answer["rollout"]
    else:
        placed, created, replaced = _install_here(ctx, ask)
    if created:
        console.print(f"{len(created)} placement group(s) created: {', '.join(created)}")
    if replaced is not None:
        report_rollout(replaced)
    said_policy(ctx, placed, scale)


def _install_here(ctx: CliContext, ask: InstallAsk) -> tuple[str, list[str], dict[str, Any] | None]:
    """Planned and made here, asking at this terminal; replacements through
    the running node (its admin socket), or made at once when none runs."""
    from letsinfer.admission.gguf import Refused
    from letsinfer.admission.install import install_model, replace_directly
    from letsinfer.audit.anchor import open_authority
    from letsinfer.cli.said import say_here

    assert ctx.identity is not None
    store = open_authority(ctx.home)
    try:
        try:
            done = install_model(
                ctx.home,
                store,
                ctx.identity.node_id,
                say_here,
                ask,
                lambda question, default: click.confirm(question, default=default),
            )
        except Refused as exc:
            raise click.ClickException(str(exc)) from None
        if done.replacing is None:
            return done.model, done.created, None
        answer = ask_main(
            ctx,
            "POST",
            f"/v1/ops/models/{segment(done.model)}/replace",
            json={"replacements": done.replacements()},
            timeout=None,
        )
        if answer is None:
            replace_directly(ctx.home, store, done, say_here)
        return done.model, done.created, answer
    finally:
        store.close()


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
