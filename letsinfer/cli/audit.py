"""``letsinfer audit``: read and verify the tamper-evident audit chain."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

import click

from letsinfer.authority.audit import verify_chain
from letsinfer.cli import cli
from letsinfer.cli.output import console, emit
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.store import AuthorityStore


@cli.group()
def audit() -> None:
    """The audit chain of every mutation and denial (on the main: the cluster's;
    on another node: what happened on that node)."""


def _open(ctx: CliContext) -> AuthorityStore:
    if ctx.identity is None or not ctx.home.database.exists():
        raise click.ClickException("no letsinfer node here, so no audit chain")
    return AuthorityStore(ctx.home.database)


@scoped(audit, "list", scope="all")
@click.option("--limit", type=click.IntRange(min=1), help="Only the newest N records.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_audit(ctx: CliContext, limit: int | None, as_json: bool) -> None:
    """List audit records, oldest first."""
    store = _open(ctx)
    try:
        records = store.list_audit(limit)
    finally:
        store.close()
    rows = [
        {**asdict(r), "time": datetime.fromtimestamp(r.ts, UTC).isoformat(timespec="seconds")}
        for r in records
    ]
    emit(
        rows,
        ["seq", "time", "actor", "role", "action", "target", "outcome"],
        as_json=as_json,
        title="audit records",
    )


@scoped(audit, "verify", scope="all")
@click.pass_obj
def verify(ctx: CliContext) -> None:
    """Check every link of the chain; exit 1 naming the first bad record."""
    store = _open(ctx)
    try:
        records = store.list_audit()
    finally:
        store.close()
    broken = verify_chain(records)
    if broken is not None:
        raise click.ClickException(f"audit chain broken at record {broken.seq}: {broken.reason}")
    console.print(f"audit chain intact: {len(records)} records")
