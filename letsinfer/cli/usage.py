"""``letsinfer request`` and ``letsinfer usage``: what the gateway answered,
one request at a time or summed, from the main's request records."""

from __future__ import annotations

import csv
import json
import sys
from datetime import datetime
from typing import Any

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.cli import cli
from letsinfer.cli.local import segment
from letsinfer.cli.output import console, emit
from letsinfer.cli.remote import call
from letsinfer.cli.scope import CliContext, ScopedCommand
from letsinfer.usage.summary import (
    USAGE_COLUMNS,
    KeySpan,
    NoRecords,
    NoSuchRequest,
    SummedBy,
    key_spans,
    request_rows,
    usage_rows,
)


def _node_names(ctx: CliContext) -> dict[str, str]:
    store = open_authority(ctx.home)
    try:
        return {n.id: n.name for n in store.list_nodes(include_removed=True)}
    finally:
        store.close()


def _key_spans(ctx: CliContext) -> list[KeySpan]:
    store = open_authority(ctx.home)
    try:
        return key_spans(store.list_api_keys(include_revoked=True))
    finally:
        store.close()


def _keep_days(ctx: CliContext) -> int:
    try:
        return config.load(ctx.home.config_file).requests.keep_days
    except config.ConfigError:
        return config.RequestSettings().keep_days


@cli.command("request", cls=ScopedCommand, scope="main", remote="viewer")
@click.argument("request_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def request(ctx: CliContext, request_id: str, as_json: bool) -> None:
    """What happened to one request: its key, model, placement group and node,
    status, tokens, time to first token and duration (never its text).
    REQUEST_ID is the X-Request-Id the client sent or the gateway returned."""
    if ctx.remote is not None:
        path = f"/v1/ops/requests/{segment(request_id)}"
        rows: list[dict[str, Any]] = call(ctx.remote, "GET", path)
    else:
        try:
            rows = request_rows(
                ctx.home.requests_database,
                request_id,
                lambda: _node_names(ctx),
                lambda: _keep_days(ctx),
            )
        except (NoRecords, NoSuchRequest) as exc:
            raise click.ClickException(str(exc)) from exc
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


@cli.command("usage", cls=ScopedCommand, scope="main", remote="viewer")
@click.option(
    "--by",
    type=click.Choice(["key", "model", "node", "tag", "project"]),
    default="key",
    show_default=True,
    help="What to sum the records by.",
)
@click.option("--since", metavar="DATE", help="Only requests from then on (ISO date or time).")
@click.option("--csv", "as_csv", is_flag=True, help="Comma-separated values, with a header.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def usage(ctx: CliContext, by: SummedBy, since: str | None, as_csv: bool, as_json: bool) -> None:
    """Requests and tokens summed per API key, model, node, tag or project, from
    the kept request records (errors: answers with status 400 or above). By tag
    (the X-Letsinfer-Tags clients send), a request counts under each of its
    tags; by project, under its key's project (revoked keys' too; '-': a key
    in no project)."""
    if as_csv and as_json:
        raise click.UsageError("--csv and --json are alternatives: choose one")
    start = _since(since)  # (this machine's local time, as on the main)
    if ctx.remote is not None:
        query = f"?by={by}" + ("" if start is None else f"&since={start!r}")
        rows: list[dict[str, Any]] = call(ctx.remote, "GET", f"/v1/ops/usage{query}")
    else:
        try:
            rows = usage_rows(
                ctx.home.requests_database,
                by,
                start,
                lambda: _node_names(ctx),
                lambda: _key_spans(ctx),
            )
        except NoRecords as exc:
            raise click.ClickException(str(exc)) from exc
    if as_csv:
        writer = csv.DictWriter(sys.stdout, [by, *USAGE_COLUMNS], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return
    emit(rows, [by, *USAGE_COLUMNS], as_json=as_json, title=f"usage by {by}")
