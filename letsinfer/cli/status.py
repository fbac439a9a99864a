"""``letsinfer status``: this node and, on the main, what it serves."""

from __future__ import annotations

import fcntl
from typing import Any

import click

from letsinfer.authority.anchor import open_authority
from letsinfer.cli import cli
from letsinfer.cli.output import console, emit
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.trust.material import presented_fingerprint


def _running_pid(ctx: CliContext) -> int | None:
    path = ctx.home.pid_file
    if not path.exists():
        return None
    with path.open() as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # the node holds the lock: it is running
            text = fh.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None


@scoped(cli, "status", scope="all")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def status(ctx: CliContext, as_json: bool) -> None:
    """Show this node: role, whether it runs, and its placement groups."""
    ident = ctx.identity
    pid = _running_pid(ctx)
    info: dict[str, Any] = {
        "home": str(ctx.home.etc.parent),
        "initialised": ident is not None,
        "running": pid is not None,
        "pid": pid,
        "node_id": ident.node_id if ident else None,
        "name": ident.name if ident else None,
        "role": ident.role if ident else None,
        "main": ident.main_address if ident else None,
        # What a main pins when it enrolls this node (`node add --fingerprint`).
        "fingerprint": presented_fingerprint(ctx.home, ident) if ident else None,
        # The cluster CA's fingerprint (a main's own, a child's main's): what a
        # candidate compares enrollment requests with (`node accept --ca-fingerprint`).
        "ca_fingerprint": ident.cluster if ident else None,
        "placement_groups": [],
    }
    if ident is not None and ident.role == "main" and ctx.home.database.exists():
        store = open_authority(ctx.home)
        try:
            info["placement_groups"] = [
                {
                    "id": pg.id,
                    "model": pg.service,
                    "node": pg.node_id,
                    "target": pg.target,
                    "desired": pg.desired,
                    "state": pg.state if pid else "down",
                    "endpoint": pg.endpoint,
                    "pid": pg.pid,
                    "restarts": pg.restarts,
                    "detail": pg.detail,
                }
                for pg in store.list_placement_groups()
            ]
        finally:
            store.close()
    if as_json:
        emit([info], [], as_json=True)
        return
    if ident is None:
        console.print(f"no letsinfer node in {info['home']} (start one with `letsinfer up`)")
        return
    state = f"[green]running[/green] (pid {pid})" if pid else "[red]not running[/red]"
    console.print(f"{ident.role} node [bold]{ident.name}[/bold] ({ident.node_id}): {state}")
    console.print(f"certificate sha256:{info['fingerprint']}")
    if info["ca_fingerprint"]:
        console.print(f"cluster CA sha256:{info['ca_fingerprint']}")
    emit(
        info["placement_groups"],
        ["id", "model", "target", "state", "endpoint", "restarts", "detail"],
        as_json=False,
        title="placement groups",
    )
