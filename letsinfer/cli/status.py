"""``letsinfer status``: this node and, on the main, what it serves.

Called on every check by people, scripts and the Ansible modules, so it loads
only what it shows: no cryptography (the fingerprints are digests of the
certificate files), no HTTP client library.

Always about this machine, even with a controller selected (as plain
``doctor``): what its callers read (``running``, ``pid``, ``home``,
``paths``, the exit 3 of "no node here") would otherwise silently describe
another machine wherever a controller happens to be selected (an exported
LETSINFER_CONTROLLER). The main's status from a workstation is `cluster
status`, `model list` and `node list`, which run there.
"""

from __future__ import annotations

from typing import Any

import click

from letsinfer.cli import cli
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.home import Home
from letsinfer.trust.presented import file_fingerprint, presented_cert


def _served(ctx: CliContext, node_id: str) -> dict[str, Any]:
    """The main's own state and every model and group, as every display shows them."""
    from letsinfer.authority.views import group_object, model_object
    from letsinfer.cli.shown import read_scene, read_store

    store = read_store(ctx.home)
    try:
        scene = read_scene(ctx, store)
        own = scene.nodes.get(node_id)
        return {
            "state": scene.node_state(own) if own is not None else "down",
            "paused": bool(own and own.paused),
            "cluster": "stopped" if scene.cluster_stopped else "running",
            "models": [model_object(store, scene, svc) for svc in store.list_services()],
            "placement_groups": [
                group_object(store, scene, pg) for pg in store.list_placement_groups()
            ],
        }
    finally:
        store.close()


def _running_elsewhere(home: Home) -> Home | None:
    """Another default home of this machine where a node runs, if any."""
    for other in (Home.system(), Home.user()):
        try:
            if other != home and other.running_pid() is not None:
                return other
        except OSError:  # not ours to read
            continue
    return None


@scoped(cli, "status", scope="all")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (one object).")
@click.pass_obj
def status(ctx: CliContext, as_json: bool) -> None:
    """This node: role, whether it runs, what it serves and in which state.

    On the main: each model and placement group in the same words as `model
    list`, `node list` and `topology` (ready, starting, paused, draining,
    parked, stopped, system stopped, down...).

    Always this machine's node, even with a controller selected; the main's
    state from a workstation: `letsinfer cluster status`."""
    ident = ctx.identity
    pid = ctx.home.running_pid()
    info: dict[str, Any] = {
        "home": ctx.home.label,
        "paths": ctx.home.paths(),
        "initialised": ident is not None,
        "running": pid is not None,
        "pid": pid,
        "node_id": ident.node_id if ident else None,
        "name": ident.name if ident else None,
        "role": ident.role if ident else None,
        "main": ident.main_address if ident else None,
        # What a main pins when it enrolls this node (`node add --fingerprint`).
        "fingerprint": file_fingerprint(presented_cert(ctx.home, ident)) if ident else None,
        # The cluster CA's fingerprint (a main's own, a child's main's): what a
        # candidate compares enrollment requests with (`node accept --ca-fingerprint`).
        "ca_fingerprint": ident.cluster if ident else None,
        "state": ("running" if pid else "down") if ident else None,
        "paused": False,
        "cluster": None,
        "models": [],
        "placement_groups": [],
    }
    if ident is not None and ident.role == "main" and ctx.home.database.exists():
        info.update(_served(ctx, ident.node_id))
    if as_json:
        from letsinfer.cli.output import emit_object

        emit_object(info)
        return
    from letsinfer.cli.output import console, emit

    if ident is None:
        from letsinfer.cli.remote import selected_name

        elsewhere = _running_elsewhere(ctx.home)
        chosen = selected_name(ctx.home, ctx.controller)
        hint = (
            f"a node runs in {elsewhere.label}: `letsinfer --home {elsewhere.label} status`"
            if elsewhere
            else f"status is about this machine, even with controller {chosen} selected; "
            "the main's status: `letsinfer cluster status`"
            if chosen
            else "start one with `letsinfer up`"
        )
        console.print(f"no letsinfer node in {info['home']} ({hint})", highlight=False)
        raise SystemExit(3)  # as `service status`: asked for a node, there is none
    running = f"[green]running[/green] (pid {pid})" if pid else "[red]not running[/red]"
    if pid and info["paused"]:
        running += ", [yellow]paused[/yellow]: admits no new requests (`letsinfer node resume`)"
    if info["cluster"] == "stopped":
        running += ", [red]cluster stopped[/red] (`letsinfer cluster start`)"
    console.print(
        f"{ident.role} node [bold]{ident.name}[/bold] ({ident.node_id}): {running}",
        highlight=False,
    )
    console.print(f"home {info['home']}", highlight=False)
    if info["fingerprint"]:
        console.print(f"certificate sha256:{info['fingerprint']}", highlight=False)
    if info["ca_fingerprint"]:
        console.print(f"cluster CA sha256:{info['ca_fingerprint']}", highlight=False)
    if ident.role != "main":
        return
    emit(
        [{**m, "ready": f"{m['ready']}/{m['total']}"} for m in info["models"]],
        ["name", "state", "ready"],
        as_json=False,
        title="models",
    )
    emit(
        info["placement_groups"],
        ["id", "model", "node", "state", "endpoint", "restarts", "detail"],
        as_json=False,
        title="placement groups",
    )
