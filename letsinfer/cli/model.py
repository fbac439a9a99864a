"""``letsinfer model``: the model services this cluster serves."""

from __future__ import annotations

import click

from letsinfer.authority.views import adapter_named, model_object, shown_model
from letsinfer.cli import LazyGroup, cli
from letsinfer.cli.model_external import (
    show_external,
)
from letsinfer.cli.output import brief, console, emit, emit_object
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.cli.shown import read_scene, read_store

# Each subcommand's module, imported when that subcommand is looked up: `model
# list` loads none of what adds, places or pulls models.
SUBCOMMANDS = {
    "abort": "model_canary",
    "add": "model_add",
    "adapter": "model_adapter",
    "canary": "model_canary",
    "fallback": "model_fallback",
    "gate": "model_gate",
    "install": "model_install",
    "plan": "model_plan",
    "promote": "model_canary",
    "pull": "model_pull",
    "remove": "model_lifecycle",
    "resume": "model_state",
    "rollback": "model_lifecycle",
    "scale": "model_scale",
    "start": "model_state",
    "stop": "model_state",
    "update": "model_update",
    "upgrade": "model_lifecycle",
}


@cli.group(cls=LazyGroup, modules=SUBCOMMANDS)
def model() -> None:
    """Model services: add, pull, place, start, stop, upgrade, remove.

    A model service is the name clients ask for; it runs as one or more
    placement groups (an engine on a node's GPUs or CPU)."""


@scoped(model, "list", scope="main", remote="viewer")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_models(ctx: CliContext, as_json: bool) -> None:
    """List model services with their state and placement groups."""
    if ctx.remote is not None:
        from letsinfer.cli.remote import call

        rows = call(ctx.remote, "GET", "/v1/ops/models")
    else:
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


def refuse_adapter_name(ctx: CliContext, name: str, verb: str) -> None:
    """Refuse `model VERB ADAPTER` saying what the name is (the authority would
    only say there is no such model)."""
    store = read_store(ctx.home)
    try:
        why = adapter_named(store, name, verb)
    finally:
        store.close()
    if why is not None:
        raise click.ClickException(why)


@scoped(model, "show", scope="main", remote="viewer")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (one object).")
@click.pass_obj
def show(ctx: CliContext, name: str, as_json: bool) -> None:
    """One model: its artifact, state and every placement group with release, GPUs
    and state."""
    if ctx.remote is not None:
        from letsinfer.cli.local import segment
        from letsinfer.cli.remote import call

        info = call(ctx.remote, "GET", f"/v1/ops/models/{segment(name)}/show")
    else:
        store = read_store(ctx.home)
        try:
            info = shown_model(store, read_scene(ctx, store), name)
        finally:
            store.close()
    if as_json:
        emit_object(info)
        return
    if info["external"]:
        console.print(f"[bold]{info['name']}[/bold] external: {info['state']}", highlight=False)
    else:
        console.print(
            f"[bold]{info['name']}[/bold] sha256:{brief(info['sha256'], 16)} "
            f"{info['size'] / 1e6:.1f} MB: {info['state']}, "
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
    ran = list(
        dict.fromkeys(
            (w["commit"] or "")[:12] or f"sha256:{w['sha256'][:12]}"
            for w in info.get("weights", [])  # (.get: a main of an earlier release)
        )
    )
    if ran:
        console.print(f"weights it ran (rollback --weights): {', '.join(ran)}", highlight=False)
    if info.get("gate"):
        gate = info["gate"]
        console.print(f"gate: {gate['suite']}, min score {gate['min_score']:g}", highlight=False)
