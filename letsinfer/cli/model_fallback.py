"""``letsinfer model fallback``: the model that answers when another cannot."""

from __future__ import annotations

import click

from letsinfer.audit.anchor import open_authority
from letsinfer.authority.external import fallback_notes, set_fallback
from letsinfer.cli.local import segment
from letsinfer.cli.model import model
from letsinfer.cli.output import console
from letsinfer.cli.remote import ask_main
from letsinfer.cli.scope import CliContext, scoped


@scoped(model, "fallback", scope="main", remote="administrator")
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
    target = None if clear else other
    # With the node running its gateway uses the change before this returns.
    answer = ask_main(
        ctx, "POST", f"/v1/ops/models/{segment(name)}/fallback", json={"fallback": target}
    )
    if answer is None:  # no node runs here: write the authority directly
        store = open_authority(ctx.home)
        try:
            svc = set_fallback(store, name, target)
            answer = {
                "model": svc.name,
                "fallback": svc.fallback,
                "notes": fallback_notes(store, svc.name),
            }
        finally:
            store.close()
    said = f"falls back to {answer['fallback']}" if answer["fallback"] else "no fallback"
    console.print(f"model {answer['model']}: {said}", highlight=False)
    for note in answer["notes"]:
        console.print(f"[dim]note[/dim]: {note}", highlight=False)
