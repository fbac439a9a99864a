"""``letsinfer model plan``: where a model would go, and why not elsewhere, changing nothing."""

from __future__ import annotations

from urllib.parse import urlencode

import click

from letsinfer import config
from letsinfer.admission.plan import planned
from letsinfer.audit.anchor import open_authority
from letsinfer.cli.local import segment
from letsinfer.cli.model import model
from letsinfer.cli.model_add import gpus_option, target_option
from letsinfer.cli.output import console, emit
from letsinfer.cli.remote import call
from letsinfer.cli.scope import CliContext, scoped


@scoped(model, "plan", scope="main", remote="viewer")
@click.argument("name")
@target_option
@gpus_option
@click.option(
    "--engine",
    type=click.Choice(["xllamacpp", "llama-server"]),
    metavar="ENGINE",
    help="Engine for cpu targets: xllamacpp or llama-server (default: the configured one).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def plan(
    ctx: CliContext, name: str, target: str, gpus: int, engine: str | None, as_json: bool
) -> None:
    """For every active node: whether the model fits, on which GPUs, with which runtime
    release, and why a node is skipped. The same planner as `model install`."""
    if ctx.remote is not None:
        asked = {"target": target, "gpus": gpus, **({"engine": engine} if engine else {})}
        query = urlencode(asked)
        shown = call(ctx.remote, "GET", f"/v1/ops/models/{segment(name)}/plan?{query}")
    else:
        assert ctx.identity is not None
        store = open_authority(ctx.home)
        try:
            shown = planned(
                store,
                ctx.home.model_store,
                config.load(ctx.home.config_file),
                ctx.identity.node_id,
                name,
                target,
                gpus,
                engine,
            )
        finally:
            store.close()
    rows = shown["nodes"]
    if as_json:
        emit(rows, [], as_json=True)
        return
    fitting = [r for r in rows if r["fits"]]
    console.print(f"[bold]{shown['model']}[/bold]: {len(fitting)} of {len(rows)} node(s)")
    for r in rows:
        if r["fits"]:
            gpus_text = f" on {', '.join(r['gpus'])}" if r["gpus"] else ""
            fit = f", needs {shown['fits'][r['node']]}" if r["node"] in shown["fits"] else ""
            console.print(f"  [green]fits[/green]  {r['node']}: {r['release']}{gpus_text}{fit}")
        else:
            console.print(f"  [yellow]skip[/yellow]  {r['node']}: {r['reason']}")
