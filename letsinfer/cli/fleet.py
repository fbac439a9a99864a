"""``letsinfer fleet``: run the Ansible collection's playbooks against an inventory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from letsinfer.cli import cli
from letsinfer.cli.output import console
from letsinfer.cli.scope import scoped
from letsinfer.fleet.apply import FleetError, Progress, apply, find_playbook

_COLOURS = {
    "ok": "green",
    "changed": "yellow",
    "failed": "red",
    "unreachable": "red",
    "skipped": "cyan",
    "running": "blue",
    "done": "green",
}


def _search_dirs() -> list[Path]:
    here = Path.cwd()
    return [here / "playbooks", here]


def render(progress: Progress) -> Group:
    table = Table(title=progress.play or None, expand=False)
    for col in ("host", "task", "status"):
        table.add_column(col)
    for hp in progress.hosts.values():
        table.add_row(hp.host, hp.task, Text(hp.status, style=_COLOURS.get(hp.status, "")))
    return Group(table)


def summary(progress: Progress) -> Table:
    table = Table(title="summary")
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped", "rescued"):
        table.add_column(col, justify="left" if col == "host" else "right")
    for hp in progress.hosts.values():
        table.add_row(
            hp.host,
            str(hp.ok),
            str(hp.changed),
            Text(str(hp.failed), style="red" if hp.failed else ""),
            Text(str(hp.unreachable), style="red" if hp.unreachable else ""),
            str(hp.skipped),
            str(hp.rescued),
        )
    return table


def _extra_vars(values: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        if item.startswith("@"):
            raise click.BadParameter(
                "files are not supported; pass KEY=VALUE or JSON", param_hint="-e"
            )
        if item.lstrip().startswith("{"):
            try:
                out.update(json.loads(item))
            except json.JSONDecodeError as exc:
                raise click.BadParameter(f"{item!r}: {exc}", param_hint="-e") from exc
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE or JSON", param_hint="-e")
        out[key] = value
    return out


@cli.group()
def fleet() -> None:
    """Install, firewall, upgrade and wipe machines with the Ansible collection."""


@scoped(fleet, "apply", scope="all")
@click.argument("playbook")
@click.option(
    "-i", "--inventory", required=True, type=click.Path(path_type=Path),
    help="Inventory file or directory (e.g. inventories/sample).",
)  # fmt: skip
@click.option("-l", "--limit", help="Only these hosts or groups (Ansible pattern).")
@click.option("-e", "--extra-vars", "extra", multiple=True, help="KEY=VALUE or a JSON object.")
@click.option("--check", is_flag=True, help="Show what would change; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON, no live view.")
def fleet_apply(
    playbook: str,
    inventory: Path,
    limit: str | None,
    extra: tuple[str, ...],
    check: bool,
    as_json: bool,
) -> None:
    """Run PLAYBOOK (a path, or a name in ./playbooks such as `site`) against an inventory.

    Shows each host's current task while it runs, then a summary; exits
    non-zero when any host failed or was unreachable.
    """
    try:
        path = find_playbook(playbook, _search_dirs())
        extravars = _extra_vars(extra)
        if as_json:
            result = apply(path, inventory, extravars=extravars, limit=limit, check=check)
        else:
            with Live(render(Progress()), console=console, refresh_per_second=8) as live:
                result = apply(
                    path,
                    inventory,
                    extravars=extravars,
                    limit=limit,
                    check=check,
                    on_event=lambda p: live.update(render(p)),
                )
    except FleetError as exc:
        raise click.ClickException(str(exc)) from exc
    progress = result.progress
    if as_json:
        click.echo(
            json.dumps(
                {
                    "playbook": str(path),
                    "rc": result.rc,
                    "status": result.status,
                    "hosts": {
                        h.host: {
                            "ok": h.ok,
                            "changed": h.changed,
                            "failed": h.failed,
                            "unreachable": h.unreachable,
                            "skipped": h.skipped,
                            "rescued": h.rescued,
                        }
                        for h in progress.hosts.values()
                    },
                    "failures": [
                        {"host": h, "task": t, "message": m} for h, t, m in progress.failures
                    ],
                }
            )
        )
    else:
        console.print(summary(progress))
        for host, task, message in progress.failures:
            console.print(f"[red]{host}[/red] {task}: {message}")
    if not result.ok:
        raise SystemExit(result.rc or 1)
