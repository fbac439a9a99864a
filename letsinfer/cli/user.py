"""``letsinfer user``: the portal's accounts (docs/portal.md). A shell on the
main is what makes an administrator: approving, suspending and removing
accounts happen here, never in the portal.

These commands write the authority directly, then ask the running node (if
any) to apply the change at once: a suspended account's keys are refused
from its next request on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import click

from letsinfer.audit.anchor import open_authority
from letsinfer.authority import people
from letsinfer.cli import cli
from letsinfer.cli.local import ask_node
from letsinfer.cli.output import console, emit
from letsinfer.cli.scope import SHELL_ONLY, CliContext, scoped


@cli.group()
def user() -> None:
    """Portal accounts: approve, suspend, remove, reset a password.

    Grant one the operator role with `user grant NAME operator`."""


def changed(ctx: CliContext, change: Callable[..., object], *args: object) -> None:
    """``change(store, *args)`` in the authority, then applied by the running node."""
    store = open_authority(ctx.home)
    try:
        change(store, *args)
    finally:
        store.close()
    applied(ctx)


def applied(ctx: CliContext) -> None:
    """The running node applies what was written (no node: at its start).
    The change is made already: a node this user cannot reach applies it at
    its next refresh of keys (``[gateway] key_cache_ttl_s``)."""
    try:
        ask_node(ctx.home, "POST", "/v1/local/apply", json={})
    except click.ClickException as exc:
        console.print(f"changed; the running node applies it within seconds ({exc.message})")


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


@scoped(user, "list", scope="main", remote=SHELL_ONLY)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_users(ctx: CliContext, as_json: bool) -> None:
    """Accounts: state (pending, active, suspended), project, operator."""
    store = open_authority(ctx.home)
    try:
        rows = [
            {**people.account_json(a), "created": _when(a.created_at)}
            for a in store.list_accounts()
        ]
    finally:
        store.close()
    for r in rows:
        r.pop("created_at")
    emit(rows, ["name", "state", "project", "operator", "created"], as_json=as_json, title="users")


@scoped(user, "approve", scope="main", remote=SHELL_ONLY)
@click.argument("name")
@click.option("--project", required=True, help="The project the account works in.")
@click.pass_obj
def approve(ctx: CliContext, name: str, project: str) -> None:
    """Let NAME sign in and make keys in PROJECT (reinstates a suspended one)."""
    changed(ctx, people.approve, name, project)
    console.print(f"user {name} approved in project {project}")


@scoped(user, "suspend", scope="main", remote=SHELL_ONLY)
@click.argument("name")
@click.pass_obj
def suspend(ctx: CliContext, name: str) -> None:
    """Sign NAME out and refuse its keys from their next request on."""
    changed(ctx, people.suspend, name)
    console.print(f"user {name} suspended: its sessions ended, its keys are refused")


@scoped(user, "remove", scope="main", remote=SHELL_ONLY)
@click.argument("name")
@click.pass_obj
def remove(ctx: CliContext, name: str) -> None:
    """Remove NAME: its sessions end and its keys are revoked."""
    changed(ctx, people.remove, name)
    console.print(f"user {name} removed, its keys revoked")


@scoped(user, "reset-password", scope="main", remote=SHELL_ONLY)
@click.argument("name")
@click.pass_obj
def reset_password(ctx: CliContext, name: str) -> None:
    """Give NAME a new random password, shown once; its sessions end."""
    store = open_authority(ctx.home)
    try:
        password = people.reset_password(store, name)
    finally:
        store.close()
    click.echo(password)


@scoped(user, "grant", scope="main", remote=SHELL_ONLY)
@click.argument("name")
@click.argument("role", type=click.Choice(["operator"]))
@click.pass_obj
def grant(ctx: CliContext, name: str, role: str) -> None:
    """Let NAME see the cluster pages (read-only)."""
    store = open_authority(ctx.home)
    try:
        people.grant(store, name, role)
    finally:
        store.close()
    console.print(f"user {name} is an {role}")
