"""``letsinfer model adapter``: LoRA adapters served by name by their base model's groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import click

from letsinfer.audit.anchor import open_authority
from letsinfer.authority.adapters import adapter_rows, add_adapter, remove_adapter
from letsinfer.cli.local import ask_node, segment
from letsinfer.cli.model import model
from letsinfer.cli.output import console, emit
from letsinfer.cli.remote import call
from letsinfer.cli.scope import CliContext, scoped


@model.group()
def adapter() -> None:
    """LoRA adapters: clients name one as their model; its base model's groups serve it."""


def _reload(ctx: CliContext, base: str) -> None:
    """With the node running, the base model's groups load the adapters again,
    one at a time (each beside itself where capacity allows); otherwise they
    load them when the node starts."""
    answer = ask_node(ctx.home, "POST", f"/v1/ops/models/{segment(base)}/reload", timeout=None)
    if answer is None:
        store = open_authority(ctx.home)
        try:  # no engine of the main runs: each loads the adapters as they are when it starts
            store.unpin_adapters([pg.id for pg in store.list_placement_groups(service=base)])
        finally:
            store.close()
    _said_reload(base, answer)


def _said_reload(base: str, answer: dict[str, Any] | None) -> None:
    """What the groups' reload said (None: no node runs on the main)."""
    if answer is None:
        console.print(f"no node runs here: {base}'s groups load it when the node starts")
        return
    for g in answer["placement_groups"]:
        console.print(f"  {g['group']} on {g['node']}: {g['outcome']}", highlight=False)
    for g in answer["placement_groups"]:
        if g.get("dark"):
            console.print(f"[yellow]{g['group']} on {g['node']}: {g['dark']}[/yellow]")
    if not answer["ok"]:
        raise click.ClickException(
            f"{base}: a placement group did not come back with its adapters (see above)"
        )


@scoped(adapter, "add", scope="main", remote="operator")
@click.argument("model_name", metavar="MODEL")
@click.argument("name")
@click.option(
    "--gguf",
    "gguf_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The adapter as a LoRA GGUF (llama.cpp's convert_lora_to_gguf.py writes one). "
    "From a paired controller: the absolute path of a file on the main, under its model "
    "store, its mirror or a directory [control] add_from lists (nothing is uploaded).",
)
@click.pass_obj
def add(ctx: CliContext, model_name: str, name: str, gguf_path: Path) -> None:
    """Add a LoRA adapter of MODEL, served as the model NAME. Refused unless it
    fits MODEL's architecture and tensors. MODEL's groups restart one at a
    time to load it."""
    if ctx.remote is not None:
        done = call(
            ctx.remote,
            "POST",
            f"/v1/ops/models/{segment(model_name)}/adapters",
            {"name": name, "gguf": str(gguf_path)},
            timeout=None,
        )
        _said_added(done["adapter"], done["model"], done["sha256"])
        _said_reload(done["model"], done["reload"])
        return
    store = open_authority(ctx.home)
    try:
        made = add_adapter(store, ctx.home.model_store, model_name, name, gguf_path.expanduser())
    finally:
        store.close()
    _said_added(made.name, made.service, made.artifact_digest)
    _reload(ctx, made.service)


def _said_added(name: str, base: str, digest: str) -> None:
    console.print(f"added LoRA adapter [bold]{name}[/bold] of {base} (sha256:{digest[:12]})")


@scoped(adapter, "list", scope="main", remote="viewer")
@click.argument("model_name", metavar="[MODEL]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_adapters(ctx: CliContext, model_name: str | None, as_json: bool) -> None:
    """List LoRA adapters (of MODEL only, when given)."""
    rows: list[dict[str, Any]]
    if ctx.remote is not None:
        query = f"?{urlencode({'model': model_name})}" if model_name is not None else ""
        rows = call(ctx.remote, "GET", f"/v1/ops/adapters{query}")
    else:
        store = open_authority(ctx.home)
        try:
            rows = adapter_rows(store, model_name)
        finally:
            store.close()
    if as_json:
        emit(rows, [], as_json=True)
        return
    emit(
        [{**r, "sha256": r["sha256"][:12], "size": f"{r['size'] / 1e6:.1f} MB"} for r in rows],
        ["name", "model", "size", "sha256", "added", "fallback"],
        as_json=False,
        title="LoRA adapters",
    )


@scoped(adapter, "remove", scope="main", remote="operator")
@click.argument("name")
@click.pass_obj
def remove(ctx: CliContext, name: str) -> None:
    """Remove a LoRA adapter: requests naming it get 404 at once (its base
    model's groups then restart one at a time without it)."""
    if ctx.remote is not None:
        done = call(ctx.remote, "POST", f"/v1/ops/adapters/{segment(name)}/remove", timeout=None)
        _said_removed(done["adapter"], done["model"], done["narrowed"])
        _said_reload(done["model"], done["reload"])
        return
    store = open_authority(ctx.home)
    try:
        gone, narrowed = remove_adapter(store, ctx.home.model_store, name)
    finally:
        store.close()
    _said_removed(gone.name, gone.service, narrowed)
    _reload(ctx, gone.service)


def _said_removed(name: str, base: str, narrowed: list[str]) -> None:
    console.print(f"removed LoRA adapter [bold]{name}[/bold] of {base}")
    if narrowed:
        console.print(
            f"  dropped from the model lists of API keys: {', '.join(narrowed)}", highlight=False
        )
