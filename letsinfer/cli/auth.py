"""``letsinfer auth``: API keys for gateway clients."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from letsinfer.authority.anchor import open_authority
from letsinfer.authority.apikeys import create_key, revoke_key
from letsinfer.cli import cli
from letsinfer.cli.local import ask_node, segment
from letsinfer.cli.output import console, emit
from letsinfer.cli.scope import CliContext, scoped


@cli.group()
def auth() -> None:
    """API keys and controllers.

    API keys are what clients send to the gateway (`auth key`); controllers are
    operators' workstations paired with a role (`auth controller`)."""


@auth.group()
def key() -> None:
    """Create, list and revoke API keys."""


def _when(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else None


@scoped(key, "create", scope="main")
@click.argument("name")
@click.option(
    "--model",
    "models",
    multiple=True,
    help="Allow only this model (name or alias); repeat for more. Default: all.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    help="At most this many requests at once with this key.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def create(
    ctx: CliContext, name: str, models: tuple[str, ...], concurrency: int | None, as_json: bool
) -> None:
    """Create an API key; its secret is printed once and never stored."""
    body = {"name": name, "models": list(models), "concurrency": concurrency}
    made = ask_node(ctx.home, "POST", "/v1/ops/keys", json=body)
    if made is None:  # no node runs here: write the authority directly
        store = open_authority(ctx.home)
        try:
            made = create_key(store, name, models, concurrency).to_json()
        finally:
            store.close()
    if as_json:
        click.echo(json.dumps(made))
        return
    console.print(f"API key [bold]{made['name']}[/bold] created; it is shown only now:")
    click.echo(made["key"])


@scoped(key, "list", scope="main")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked keys.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_keys(ctx: CliContext, include_revoked: bool, as_json: bool) -> None:
    """List API keys (names and prefixes, never secrets)."""
    store = open_authority(ctx.home)
    try:
        keys = store.list_api_keys(include_revoked=include_revoked)
    finally:
        store.close()
    rows = [
        {
            "name": k.name,
            "prefix": k.prefix,
            "models": list(k.models),  # empty: every model, as `auth key create` takes it
            "concurrency": k.concurrency,
            "created": _when(k.created_at),
            "revoked": _when(k.revoked_at),
        }
        for k in keys
    ]
    if as_json:
        emit(rows, [], as_json=True)
        return
    emit(
        [
            {**r, "prefix": r["prefix"] + "…", "models": ", ".join(r["models"]) or "all"}
            for r in rows
        ],
        ["name", "prefix", "models", "concurrency", "created", "revoked"],
        as_json=False,
        title="API keys",
    )


@scoped(key, "revoke", scope="main")
@click.argument("name")
@click.pass_obj
def revoke(ctx: CliContext, name: str) -> None:
    """Revoke an API key. With the node running, its gateway refuses the key
    from the moment this returns; otherwise from the node's next start."""
    path = f"/v1/ops/keys/{segment(name)}/revoke"
    if ask_node(ctx.home, "POST", path) is None:
        store = open_authority(ctx.home)
        try:
            revoke_key(store, name)
        finally:
            store.close()
    console.print(f"API key [bold]{name}[/bold] revoked")
