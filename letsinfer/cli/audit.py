"""``letsinfer audit``: read and verify the tamper-evident audit chain."""

from __future__ import annotations

from typing import Any

import click

from letsinfer.audit.anchor import HeadAnchor, open_authority
from letsinfer.audit.listing import audit_rows
from letsinfer.audit.verification import verify_audit
from letsinfer.cli import cli
from letsinfer.cli.output import console, emit
from letsinfer.cli.remote import call
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.store import AuthorityStore


@cli.group()
def audit() -> None:
    """The audit chain of every mutation and denial (on the main: the cluster's;
    on another node: what happened on that node)."""


def _open(ctx: CliContext) -> AuthorityStore:
    if ctx.identity is None or not ctx.home.database.exists():
        raise click.ClickException("no letsinfer node here, so no audit chain")
    return open_authority(ctx.home)


@scoped(audit, "list", scope="all", remote="viewer")
@click.option(
    "--limit", type=click.IntRange(min=1, max=2**63 - 1), help="Only the newest N records."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_audit(ctx: CliContext, limit: int | None, as_json: bool) -> None:
    """List audit records, oldest first. ``count``: how many refusals of the
    same kind a denial record stands for. From a controller: the main's chain."""
    if ctx.remote is not None:
        query = "" if limit is None else f"?limit={limit}"
        rows: list[dict[str, Any]] = call(ctx.remote, "GET", f"/v1/ops/audit{query}")
    else:
        store = _open(ctx)
        try:
            rows = audit_rows(store, limit)
        finally:
            store.close()
    emit(
        rows,
        ["seq", "time", "actor", "role", "action", "target", "outcome", "count"],
        as_json=as_json,
        title="audit records",
    )


@scoped(audit, "verify", scope="all", remote="viewer")
@click.pass_obj
def verify(ctx: CliContext) -> None:
    """Check every link of the chain, the signed head (its signature with the
    node key, and that the record it names is still there unchanged) and, on
    the main, the heads its children reported. Exit 1 naming what is wrong."""
    if ctx.remote is not None:
        found = call(ctx.remote, "GET", "/v1/ops/audit/verify")
    else:
        store = _open(ctx)
        try:
            found = verify_audit(store, HeadAnchor.for_home(ctx.home))
        finally:
            store.close()
    if found["problems"]:
        raise click.ClickException("\n".join(found["problems"]))
    head = found["head"]
    console.print(
        f"audit chain intact: {found['records']} records"
        + (f", signed head at record {head}" if head else "")
    )
    if found["unanchored"]:
        console.print(
            f"{found['unanchored']} record(s) after the signed head are not anchored yet "
            "(appended without the node key; the next signed append covers them)"
        )
