"""``letsinfer node usage`` and ``node cleanup``: this node's home, and freeing it.

Asked of the running node through its admin socket (it knows what its engines
use now, and its main's word on its groups); when no node runs, worked out
from the home's own files (the authority on the main, the main's last word on
a child). See letsinfer/storage/.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from letsinfer.cli.local import ask_node
from letsinfer.cli.node import node
from letsinfer.cli.output import brief, console, emit
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity

if TYPE_CHECKING:  # imported by the commands that use them (see letsinfer/cli/__init__.py)
    from letsinfer.storage.uses import NodeUses


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"


def _identity(ctx: CliContext) -> NodeIdentity:
    if ctx.identity is None:
        raise click.ClickException(f"no letsinfer node in {ctx.home.label}")
    return ctx.identity


def _uses_here(home: Home, identity: NodeIdentity) -> NodeUses:
    """What uses the home's data, from its files (no node runs on it)."""
    from letsinfer.agent import reattach
    from letsinfer.storage.uses import child_uses, main_uses
    from letsinfer.store import AuthorityStore

    engines = {pg for pg, _ in reattach.running(home.engine_run)}
    if identity.role == "main":
        store = AuthorityStore(home.database)
        try:
            return main_uses(store, identity.node_id, engines)
        finally:
            store.close()
    return child_uses(home, None, engines)


@scoped(node, "usage", scope="all")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def usage(ctx: CliContext, as_json: bool) -> None:
    """What this node's home holds, by kind, model and placement group, and what is in use.

    Only this node's home is counted; links are listed, never followed.
    """
    identity = _identity(ctx)
    answer = ask_node(ctx.home, "GET", "/v1/local/storage")
    if answer is None:
        from letsinfer.storage.usage import report

        answer = report(ctx.home, _uses_here(ctx.home, identity), identity.name)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    console.print(
        f"[bold]{answer['node']}[/bold] ({answer['role']}): {_size(answer['total_bytes'])} "
        f"under {', '.join(answer['home'].values())}"
    )
    emit(
        [{"kind": k, "size": _size(v)} for k, v in answer["by_kind"].items() if v],
        ["kind", "size"],
        as_json=False,
        title="by kind",
    )
    emit(
        [
            {
                "model file": "sha256:" + brief(m["digest"], 12),
                "size": _size(m["bytes"]),
                "in use": "yes" if m["in_use"] else "no",
                "why": m["why"],
            }
            for m in answer["models"]
        ],
        ["model file", "size", "in use", "why"],
        as_json=False,
        title="models",
    )
    emit(
        [
            {
                "placement group": log["pg_id"],
                "model": log["model"] or "(gone)",
                "size": _size(log["bytes"]),
                "in use": "yes" if log["in_use"] else "no",
            }
            for log in answer["engine_logs"]
        ],
        ["placement group", "model", "size", "in use"],
        as_json=False,
        title="engine logs",
    )
    for link in answer["symlinks"]:
        console.print(
            f"link {link['path']} -> {link['points_to']} (not followed, not counted)",
            soft_wrap=True,
        )
    for other in answer["other_homes"]:
        console.print(f"{other}: another node's home (not entered)")


@scoped(node, "cleanup", scope="all")
@click.option("--yes", is_flag=True, help="Free what the review lists (else: review only).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def cleanup(ctx: CliContext, yes: bool, as_json: bool) -> None:
    """Review what this node's home may free and why that is safe; free it with --yes.

    Frees the model files of placement groups stopped on this node (the next
    `model start` downloads and verifies them again) or used by nothing here,
    and the logs of groups that no longer exist. Never a file a running group
    uses, never another node's data, never through a link.
    """
    identity = _identity(ctx)
    answer = ask_node(ctx.home, "POST", "/v1/local/storage/cleanup", json={"apply": yes})
    if answer is None:
        answer = _cleanup_here(ctx.home, identity, yes)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    _show(answer)


def _cleanup_here(home: Home, identity: NodeIdentity, apply: bool) -> dict[str, Any]:
    from letsinfer.audit.anchor import open_authority
    from letsinfer.storage.cleanup import free, review, summary
    from letsinfer.storage.routes import NOT_KNOWN

    uses = _uses_here(home, identity)
    if not uses.known:
        raise click.ClickException(NOT_KNOWN)
    releases = review(home, uses)
    if not apply:
        return summary(releases, None)
    freed = free(home, releases)
    store = open_authority(home)
    try:
        store.append_audit(
            "cli",
            "node.cleanup",
            "ok",
            target=identity.name,
            detail=f"freed {len(freed)} file(s), {sum(r.bytes for r in freed)} bytes: "
            + ", ".join(r.path for r in freed)[:900],
        )
    finally:
        store.close()
    return summary(releases, freed)


def _show(answer: dict[str, Any]) -> None:
    if not answer["review"]:
        console.print("nothing to free: every file in this home is in use or needed")
        return
    for item in answer["review"]:
        console.print(f"{item['path']} ({_size(item['bytes'])}): {item['why']}", soft_wrap=True)
    if not answer["applied"]:
        console.print(
            f"would free {_size(answer['bytes'])}; run `letsinfer node cleanup --yes` to free it"
        )
        return
    left = len(answer["review"]) - len(answer["freed"])
    note = f" ({left} file(s) changed since the review were left alone)" if left else ""
    console.print(f"freed {_size(answer['freed_bytes'])}{note}")
