"""``letsinfer webhook``: signed webhooks the main sends on events
(docs/webhooks.md). A webhook is named by its URL.

The running main reads the endpoints from the authority at each round, so
these commands write it directly (no admin-socket round trip is needed)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.cli import cli
from letsinfer.cli.output import console, emit
from letsinfer.cli.remote import call
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.fetch import FetchPolicy, FetchRefused
from letsinfer.store import AuthorityStore
from letsinfer.webhooks.endpoints import add_endpoint, remove_endpoint, send_test
from letsinfer.webhooks.events import EVENTS, UnknownEvents, parse_events
from letsinfer.webhooks.shown import delivery_rows, webhook_rows
from letsinfer.webhooks.signing import BadSecret, read_secret

MAX_URL = 2048


@cli.group(
    help="Signed webhooks (Standard Webhooks) sent on cluster events.\n\n"
    f"Events: {', '.join(EVENTS)}; '*' for all. See docs/webhooks.md."
)
def webhook() -> None:
    pass


def _store(ctx: CliContext) -> AuthorityStore:
    return open_authority(ctx.home)


@scoped(webhook, "add", scope="main", remote="administrator")
@click.argument("url")
@click.option(
    "--events",
    required=True,
    metavar="E,...",
    help="Comma-separated event names, or '*' for every event.",
)
@click.option(
    "--secret-file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A file holding the signing secret: 'whsec_' + base64 of 24-64 random bytes.",
)
@click.pass_obj
def add(ctx: CliContext, url: str, events: str, secret_file: Path) -> None:
    """Send the given events to URL, signed with the secret in --secret-file.

    URL must reach a global address, or one in a network `[fetch]
    allow_networks` lists; redirects are never followed. From a controller,
    the secret file is read here and the secret sent over mutual TLS."""
    if len(url) > MAX_URL:
        raise click.BadParameter(f"longer than {MAX_URL} characters", param_hint="'URL'")
    try:
        names = parse_events(events)
    except UnknownEvents as exc:
        raise click.BadParameter(str(exc), param_hint="'--events'") from None
    try:
        secret = read_secret(secret_file)
    except BadSecret as exc:
        raise click.BadParameter(str(exc), param_hint="'--secret-file'") from None
    if ctx.remote is not None:
        body = {"url": url, "events": list(names), "secret": secret}
        call(ctx.remote, "POST", "/v1/ops/webhooks", body)
        console.print(f"webhook {url} added: {', '.join(names)}")
        return
    settings = config.load(ctx.home.config_file)
    store = _store(ctx)
    try:
        add_endpoint(store, url, names, secret, FetchPolicy.from_settings(settings))
    except FetchRefused as exc:
        raise click.ClickException(f"webhook not added: {exc}") from None
    finally:
        store.close()
    console.print(f"webhook {url} added: {', '.join(names)}")


@scoped(webhook, "list", scope="main", remote="administrator")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_webhooks(ctx: CliContext, as_json: bool) -> None:
    """Webhooks, their events and whether they are active or disabled (and why)."""
    if ctx.remote is not None:
        rows = call(ctx.remote, "GET", "/v1/ops/webhooks")
    else:
        store = _store(ctx)
        try:
            rows = webhook_rows(store)
        finally:
            store.close()
    emit(
        rows,
        ["url", "events", "state", "disabled_reason", "created"],
        as_json=as_json,
        title="webhooks",
    )


@scoped(webhook, "remove", scope="main", remote="administrator")
@click.argument("url")
@click.pass_obj
def remove(ctx: CliContext, url: str) -> None:
    """Stop sending to URL; its pending deliveries and log go with it."""
    if ctx.remote is not None:
        call(ctx.remote, "POST", "/v1/ops/webhooks/remove", {"url": url})
    else:
        store = _store(ctx)
        try:
            remove_endpoint(store, url)
        finally:
            store.close()
    console.print(f"webhook {url} removed")


@scoped(webhook, "test", scope="main", remote="administrator")
@click.argument("url")
@click.pass_obj
def test(ctx: CliContext, url: str) -> None:
    """Send URL a signed webhook.test event now and say what it answered
    (exit 1 unless it answered 2xx)."""
    if ctx.remote is not None:
        tested = call(ctx.remote, "POST", "/v1/ops/webhooks/test", {"url": url}, timeout=None)
        status, delivered = tested["status"], tested["delivered"]
        disabled, delivery = tested["disabled"], tested["delivery"]
    else:
        settings = config.load(ctx.home.config_file)
        store = _store(ctx)
        try:
            sent = send_test(
                store, url, FetchPolicy.from_settings(settings), settings.webhooks.timeout_s
            )
        finally:
            store.close()
        status, delivered = sent.attempt.status, sent.attempt.delivered
        disabled, delivery = sent.disabled, sent.delivery.id
    if delivered:
        console.print(f"webhook {url} answered {status}: delivered ({delivery})")
        return
    if disabled:
        raise click.ClickException(f"webhook {url} answered 410 Gone: it is disabled now")
    answered = f"answered {status}" if status.isdigit() else f"was not reached: {status}"
    raise click.ClickException(f"webhook {url} {answered} ({delivery})")


@scoped(webhook, "deliveries", scope="main", remote="administrator")
@click.argument("url")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="Only the newest N deliveries.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def deliveries(ctx: CliContext, url: str, limit: int, as_json: bool) -> None:
    """URL's latest deliveries, newest first: id (the webhook-id header, the
    same at every retry), event, attempts, last status, next try or delivery time."""
    if ctx.remote is not None:
        query = urlencode({"url": url, "limit": limit})
        rows = call(ctx.remote, "GET", f"/v1/ops/webhooks/deliveries?{query}")
    else:
        store = _store(ctx)
        try:
            rows = delivery_rows(store, url, limit)
        finally:
            store.close()
    emit(
        rows,
        ["id", "event", "state", "attempts", "last_status", "next_try", "delivered_at"],
        as_json=as_json,
        title=f"deliveries to {url}",
    )
