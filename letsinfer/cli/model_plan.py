"""``letsinfer model plan``: where a model would go, and why not elsewhere, changing nothing."""

from __future__ import annotations

from typing import Any

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority import install as install_mod
from letsinfer.cli.model import model
from letsinfer.cli.model_add import fit_text, gpus_option, target_option
from letsinfer.cli.model_install import install_request
from letsinfer.cli.output import console, emit
from letsinfer.cli.scope import CliContext, scoped


@scoped(model, "plan", scope="main")
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
    assert ctx.identity is not None
    settings = config.load(ctx.home.config_file)
    store = open_authority(ctx.home)
    try:
        nodes = tuple(n.name for n in store.list_nodes() if n.state == "active")
        req = install_request(ctx, store, settings, name, nodes, target, gpus, (), engine)
        found = install_mod.plan(
            store, req, settings.control.node_stale_after_s, ctx.identity.node_id
        )
    finally:
        store.close()
    rows: list[dict[str, Any]] = []
    for p in found.placements:
        rows.append(
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
        )
    for node_name, why in found.skipped:
        rows.append(
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
        )
    rows.sort(key=lambda r: r["node"])
    if as_json:
        emit(rows, [], as_json=True)
        return
    console.print(f"[bold]{found.service}[/bold]: {len(found.placements)} of {len(rows)} node(s)")
    by_node = {p.node.name: p for p in found.placements}
    for r in rows:
        if r["fits"]:
            p = by_node[r["node"]]
            gpus_text = f" on {', '.join(p.gpus)}" if p.gpus else ""
            fit = f", needs {fit_text(p)}" if p.need else ""
            console.print(f"  [green]fits[/green]  {r['node']}: {r['release']}{gpus_text}{fit}")
        else:
            console.print(f"  [yellow]skip[/yellow]  {r['node']}: {r['reason']}")
