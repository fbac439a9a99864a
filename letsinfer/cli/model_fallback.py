"""``letsinfer model fallback``: the model that answers when another cannot."""

from __future__ import annotations

import click

from letsinfer.authority.anchor import open_authority
from letsinfer.authority.external import fallback_notes, set_fallback
from letsinfer.cli.model import model
from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext, scoped


@scoped(model, "fallback", scope="main")
@click.argument("name")
@click.argument("other", required=False)
@click.option("--clear", is_flag=True, help="No fallback: the model answers for itself.")
@click.pass_obj
def fallback(ctx: CliContext, name: str, other: str | None, clear: bool) -> None:
    """Set the model that answers NAME's requests when none of NAME's groups can
    take them (all parked, stopped, full past the queue's wait, or failing
    before the first byte); the answer then carries `x-letsinfer-fallback`.
    The key's allowlist applies to NAME, the model asked for."""
    if (other is None) == (not clear):
        raise click.UsageError("give the fallback model, or --clear")
    store = open_authority(ctx.home)
    try:
        svc = set_fallback(store, name, None if clear else other)
        notes = fallback_notes(store, svc.name)
    finally:
        store.close()
    if svc.fallback:
        console.print(f"model {svc.name}: falls back to {svc.fallback}", highlight=False)
    else:
        console.print(f"model {svc.name}: no fallback", highlight=False)
    for note in notes:
        console.print(f"[dim]note[/dim]: {note}", highlight=False)
