"""``letsinfer audit``: read and verify the tamper-evident audit chain."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

import click

from letsinfer.audit.anchor import HeadAnchor, check_anchor, open_authority
from letsinfer.audit.chain import verify_chain
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
    return open_authority(ctx.home)


@scoped(audit, "list", scope="all")
@click.option("--limit", type=click.IntRange(min=1), help="Only the newest N records.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_audit(ctx: CliContext, limit: int | None, as_json: bool) -> None:
    """List audit records, oldest first. ``count``: how many refusals of the
    same kind a denial record stands for."""
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
        ["seq", "time", "actor", "role", "action", "target", "outcome", "count"],
        as_json=as_json,
        title="audit records",
    )


@scoped(audit, "verify", scope="all")
@click.pass_obj
def verify(ctx: CliContext) -> None:
    """Check every link of the chain, the signed head (its signature with the
    node key, and that the record it names is still there unchanged) and, on
    the main, the heads its children reported. Exit 1 naming what is wrong."""
    store = _open(ctx)
    try:
        records = store.list_audit()
        anchored = check_anchor(HeadAnchor.for_home(ctx.home), store)
        children = [n for n in store.list_nodes() if n.audit_problem and n.role != "main"]
    finally:
        store.close()
    problems = []
    broken = verify_chain(records)
    if broken is not None:
        problems.append(f"audit chain broken at record {broken.seq}: {broken.reason}")
    problems += [f"audit chain not anchored: {p}" for p in anchored.problems]
    problems += [f"node {n.name}'s audit chain: {n.audit_problem}" for n in children]
    if problems:
        raise click.ClickException("\n".join(problems))
    head = anchored.head
    console.print(
        f"audit chain intact: {len(records)} records"
        + (f", signed head at record {head.count}" if head else "")
    )
    if anchored.unanchored:
        console.print(
            f"{anchored.unanchored} record(s) after the signed head are not anchored yet "
            "(appended without the node key; the next signed append covers them)"
        )
