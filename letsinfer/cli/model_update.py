"""``letsinfer model update``: a model pulled from a hub (or a mirror) moves to
a new commit of its repository: resolved, downloaded and verified as `model
pull` does, then rolled out one group at a time as `model upgrade` does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from letsinfer.cli.local import segment
from letsinfer.cli.model import model
from letsinfer.cli.model_gate import canary_option, gate_options, given_gate
from letsinfer.cli.model_install import report_rollout
from letsinfer.cli.output import console, emit_object, errors
from letsinfer.cli.remote import ask_main, call
from letsinfer.cli.said import replay, say_here
from letsinfer.cli.scope import CliContext, scoped

if TYPE_CHECKING:
    from letsinfer.admission.update import Fetched

_NEEDS_NODE = (
    "no node runs on this home: an update drains and proves placement groups through the "
    "running main. Start it (`letsinfer up`, or `letsinfer service start`) and run this again"
)


@scoped(model, "update", scope="main", remote="operator")
@click.argument("name")
@click.option(
    "--revision",
    help="Branch, tag or commit of the model's repository (default: the revision it was "
    "pulled at, e.g. main, resolved again now).",
)
@click.option("--node", "nodes", multiple=True, help="Only the groups on this node; repeatable.")
@canary_option("the new weights")
@gate_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def update(
    ctx: CliContext,
    name: str,
    revision: str | None,
    nodes: tuple[str, ...],
    canary: float | None,
    eval_suite: str | None,
    min_score: float | None,
    as_json: bool,
) -> None:
    """Move a pulled model to a new commit of the repository it came from: resolve
    the revision on the hub (or this node's mirror), download and verify it like
    `model pull`, then replace its placement groups one at a time, each new one
    proven before the old one drains. The weights it ran stay kept for `model
    rollback NAME --weights COMMIT`. Exits 1 naming the group that failed.
    With --canary, only one new group starts, beside the others."""
    from letsinfer.admission.update import Fetched
    from letsinfer.cli.bundle import TerminalProgress

    gate = given_gate(eval_suite, min_score)
    if ctx.remote is not None:  # downloaded on the main, rolled out on its loop
        # Shown as it goes, as here; with --json, printed whole after (no bars).
        shown = None if as_json else TerminalProgress(errors)
        answer = call(
            ctx.remote,
            "POST",
            f"/v1/ops/models/{segment(name)}/update-from-origin",
            {"revision": revision, "nodes": list(nodes), "gate": gate, "canary": canary},
            timeout=None,
            shown=shown,
        )
        said = answer.pop("said")
        if shown is None:
            replay(said)
        fetched = Fetched(answer["model"], answer["repo"], answer["commit"], answer["sha256"])
        rolled = answer["rollout"]
    else:
        fetched, rolled = _update_here(ctx, name, revision, nodes, canary, gate)
    if rolled is None:
        if as_json:
            emit_object({"model": fetched.model, "commit": fetched.commit, "changed": False})
        else:
            console.print(
                f"model [bold]{fetched.model}[/bold] is already "
                f"{fetched.repo}@{fetched.commit[:12]}; nothing changed"
            )
        return
    assert fetched.sha256 is not None
    if not as_json:
        what = "canary of {} on" if canary is not None else "update of {} to"
        console.print(
            f"{what.format(rolled['model'])} {fetched.repo}@{fetched.commit[:12]} "
            f"(sha256:{fetched.sha256[:12]}):",
            highlight=False,
        )
    report_rollout(rolled, as_json)


def _update_here(
    ctx: CliContext,
    name: str,
    revision: str | None,
    nodes: tuple[str, ...],
    canary: float | None,
    gate: dict[str, Any] | None,
) -> tuple[Fetched, dict[str, Any] | None]:
    """Downloaded here, then rolled out by the running node (its admin socket)."""
    from letsinfer.admission.gguf import Refused
    from letsinfer.admission.update import fetch_update
    from letsinfer.cli.bundle import TerminalProgress

    try:
        fetched = fetch_update(ctx.home, say_here, TerminalProgress(errors), name, revision)
    except Refused as exc:
        raise click.ClickException(str(exc)) from None
    if fetched.sha256 is None:
        return fetched, None
    body: dict[str, Any] = {
        "sha256": fetched.sha256,
        "size": fetched.size,
        "origin": fetched.origin,
        "nodes": list(nodes),
    }
    if gate is not None:
        body["gate"] = gate
    if canary is not None:
        body["canary"] = canary
    answer = ask_main(
        ctx, "POST", f"/v1/ops/models/{segment(fetched.model)}/update", json=body, timeout=None
    )
    if answer is None:
        raise click.ClickException(_NEEDS_NODE)
    return fetched, answer
