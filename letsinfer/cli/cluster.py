"""``letsinfer cluster``: the whole cluster at once, from the main."""

from __future__ import annotations

from typing import Any

import click

from letsinfer.audit.anchor import open_authority
from letsinfer.authority import lifecycle
from letsinfer.authority.views import cluster_object
from letsinfer.cli import cli
from letsinfer.cli.output import console, emit, emit_object
from letsinfer.cli.remote import ask_main, call
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.cli.shown import read_scene, read_store


@cli.group()
def cluster() -> None:
    """Stop, start, restart (rolling) the whole cluster, or show its state."""


def _ask(ctx: CliContext, verb: str) -> dict[str, Any] | None:
    """The running main's answer, from a controller too; None: no node runs here."""
    return ask_main(ctx, "POST", f"/v1/ops/cluster/{verb}", timeout=None)  # type: ignore[no-any-return]


@scoped(cluster, "stop", scope="main", remote="operator")
@click.pass_obj
def stop(ctx: CliContext) -> None:
    """Refuse new requests (503 system_stopped), let those in flight finish,
    then stop every placement group (their engines end, GPUs are free). The
    groups are remembered for `cluster start`."""
    answer = _ask(ctx, "stop")
    if answer is None:  # no node runs here: nothing serves; record it directly
        store = open_authority(ctx.home)
        try:
            state = lifecycle.begin_cluster_stop(store, actor="cli", role="main")
            lifecycle.complete_cluster_stop(store, state)
        finally:
            store.close()
        answer = {"stopped": state.groups, "cut": 0, "still_running": []}
    console.print(f"cluster stopped: {len(answer['stopped'])} placement group(s) stopped")
    if answer["cut"]:
        console.print(f"[yellow]{answer['cut']} request(s) still in flight were cut[/yellow]")
    if answer["still_running"]:
        raise click.ClickException(
            "these groups' engines did not report stopping yet: "
            + ", ".join(answer["still_running"])
        )


@scoped(cluster, "start", scope="main", remote="operator")
@click.pass_obj
def start(ctx: CliContext) -> None:
    """Start exactly the placement groups `cluster stop` stopped, and wait until
    each is ready (or says why not)."""
    answer = _ask(ctx, "start")
    if answer is None:
        store = open_authority(ctx.home)
        try:
            groups = lifecycle.start_cluster(store, actor="cli", role="main")
        finally:
            store.close()
        console.print(f"cluster started: {len(groups)} placement group(s) will run")
        return
    for pg, how in answer["placement_groups"].items():
        console.print(f"  {pg}: {how}", highlight=False)
    console.print(f"cluster started: {len(answer['started'])} placement group(s)")
    if not answer["ok"]:
        raise click.ClickException("some placement groups are not ready (above)")


@scoped(cluster, "restart", scope="main", remote="operator")
@click.pass_obj
def restart(ctx: CliContext) -> None:
    """Restart every engine, node by node, one group at a time, each proven before
    the next. Where spare capacity allows (free GPUs, or RAM for a cpu group) a
    fresh engine starts beside the old one, which then drains and goes: the
    model keeps serving. Otherwise the group restarts in place, and a model
    with no other replica goes dark for it: said for each such model."""
    answer = _ask(ctx, "restart")
    if answer is None:
        raise click.ClickException(
            "no node runs on this home: a rolling restart needs the running main"
        )
    for step in answer["nodes"]:
        console.print(f"  {step['node']}:", highlight=False)
        for pg, how in step["placement_groups"].items():
            console.print(f"    {pg} {how}", highlight=False)
    for line in answer.get("dark", []):
        console.print(f"[yellow]{line}[/yellow]", highlight=False)
    if not answer["ok"]:
        raise click.ClickException("the restart stopped at a group that did not come back")
    console.print("cluster restarted")


@scoped(cluster, "status", scope="main", remote="viewer")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def status(ctx: CliContext, as_json: bool) -> None:
    """Whether the cluster runs or is stopped, and every node's placement groups."""
    if ctx.remote is not None:
        info = call(ctx.remote, "GET", "/v1/ops/cluster")
    else:
        store = read_store(ctx.home)
        try:
            info = cluster_object(store, read_scene(ctx, store))
        finally:
            store.close()
    nodes = info["nodes"]
    if as_json:
        emit_object(info)
        return
    if info["stopped"]:
        console.print(
            f"cluster [red]stopped[/red] since {info['stopped_at']}; `letsinfer cluster start` "
            f"restores {len(info['groups'])} placement group(s)"
        )
    else:
        console.print("cluster [green]running[/green]")
    emit(
        [
            {
                "node": n["name"],
                "role": n["role"],
                "state": n["state"],
                "groups": ", ".join(
                    f"{g['id']} {g['model']} ({g['state']})" for g in n["placement_groups"]
                ),
            }
            for n in nodes
        ],
        ["node", "role", "state", "groups"],
        as_json=False,
        title="nodes",
    )
