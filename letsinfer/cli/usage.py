"""``letsinfer request`` and ``letsinfer usage``: what the gateway answered,
one request at a time or summed, from the main's request records."""

from __future__ import annotations

import csv
import json
import sys
from datetime import UTC, datetime
from typing import Any

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.cli import cli
from letsinfer.cli.output import console, emit
from letsinfer.cli.scope import CliContext, ScopedCommand
from letsinfer.store.requests import RequestStore, UsageBy

_USAGE_COLUMNS = ["requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens"]


def _records(ctx: CliContext) -> RequestStore:
    path = ctx.home.requests_database
    if not path.exists():
        raise click.ClickException(
            "no request records on this node yet (the gateway writes them as it answers)"
        )
    return RequestStore(path, readonly=True)


def _node_names(ctx: CliContext) -> dict[str, str]:
    store = open_authority(ctx.home)
    try:
        return {n.id: n.name for n in store.list_nodes(include_removed=True)}
    finally:
        store.close()


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


@cli.command("request", cls=ScopedCommand, scope="main")
@click.argument("request_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def request(ctx: CliContext, request_id: str, as_json: bool) -> None:
    """What happened to one request: its key, model, placement group and node,
    status, tokens, time to first token and duration (never its text).
    REQUEST_ID is the X-Request-Id the client sent or the gateway returned."""
    store = _records(ctx)
    try:
        found = store.find(request_id)
    finally:
        store.close()
    if not found:
        try:
            days = config.load(ctx.home.config_file).requests.keep_days
        except config.ConfigError:
            days = config.RequestSettings().keep_days
        raise click.ClickException(
            f"no record of request {request_id!r} (records are kept {days} days and "
            "written about a second after the answer)"
        )
    names = _node_names(ctx)
    rows: list[dict[str, Any]] = [
        {
            "request_id": r.request_id,
            "time": _when(r.ts),
            "key": r.key,
            "model": r.model,
            "placement_group": r.pg,
            "node": names.get(r.node, r.node) if r.node else None,
            "endpoint": r.endpoint,
            "stream": r.stream,
            "status": r.status,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            # An answer from the cache costs nothing; a request that reported no
            # usage (a stream its client cut) was charged this estimate instead.
            "cached": r.cached,
            "charged_tokens": r.charged,
            "ttft_ms": None if r.ttft_ms is None else round(r.ttft_ms, 2),
            "duration_ms": round(r.duration_ms, 2),
            "queue_ms": round(r.queue_ms, 2),
        }
        for r in found
    ]
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    for row in rows:
        emit(
            [{"field": k, "value": v} for k, v in row.items()],
            ["field", "value"],
            as_json=False,
            title=f"request {request_id}",
        )
    if len(rows) > 1:
        console.print(f"{len(rows)} requests carried this id (a client may reuse its ids)")


def _since(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a date (2025-01-31) or a time (2025-01-31T08:00, "
            "2025-01-31T08:00+02:00)",
            param_hint="--since",
        ) from None
    return when.timestamp()  # without an offset: this machine's local time


@cli.command("usage", cls=ScopedCommand, scope="main")
@click.option(
    "--by",
    type=click.Choice(["key", "model", "node"]),
    default="key",
    show_default=True,
    help="What to sum the records by.",
)
@click.option("--since", metavar="DATE", help="Only requests from then on (ISO date or time).")
@click.option("--csv", "as_csv", is_flag=True, help="Comma-separated values, with a header.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def usage(ctx: CliContext, by: UsageBy, since: str | None, as_csv: bool, as_json: bool) -> None:
    """Requests and tokens summed per API key, model or node, from the kept
    request records (errors: answers with status 400 or above)."""
    if as_csv and as_json:
        raise click.UsageError("--csv and --json are alternatives: choose one")
    start = _since(since)
    store = _records(ctx)
    try:
        sums = store.usage(by, start)
    finally:
        store.close()
    names = _node_names(ctx) if by == "node" else {}
    rows = [
        {
            by: names.get(u.name, u.name),
            "requests": u.requests,
            "errors": u.errors,
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        }
        for u in sums
    ]
    if as_csv:
        writer = csv.DictWriter(sys.stdout, [by, *_USAGE_COLUMNS], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return
    emit(rows, [by, *_USAGE_COLUMNS], as_json=as_json, title=f"usage by {by}")
