"""``letsinfer auth``: API keys for gateway clients."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority.apikeys import (
    BANDS,
    MAX_LIMIT,
    PERIODS,
    create_key,
    key_limits,
    key_listing,
    policy_json,
    revoke_key,
    set_policy,
)
from letsinfer.cli import LazyGroup, cli
from letsinfer.cli.local import segment
from letsinfer.cli.output import console, emit
from letsinfer.cli.remote import ask_main
from letsinfer.cli.scope import CliContext, scoped


# `auth controller` lives in cli/controller.py: an `auth key` call does not
# import its HTTP client and TLS peer code.
@cli.group(cls=LazyGroup, modules={"controller": "controller"})
def auth() -> None:
    """API keys and controllers.

    API keys are what clients send to the gateway (`auth key`); controllers are
    operators' workstations paired with a role (`auth controller`)."""


@auth.group()
def key() -> None:
    """Create, list and revoke API keys."""


class _Limit(click.ParamType):
    """A whole number of at least 1, or ``off`` in any case (clears the limit):
    click shows the metavar upper-cased, as ``N|OFF``."""

    name = "N|off"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> object:
        if value is _OFF or (isinstance(value, str) and value.strip().lower() == "off"):
            return _OFF
        text = str(value).strip()
        # Digits only: int() would also take "1_000", "+5" and other scripts' digits.
        if not (text.isascii() and text.isdigit()):
            self.fail(f"{value!r} is neither a whole number nor 'off'", param, ctx)
        if len(text.lstrip("0")) > len(str(MAX_LIMIT)):  # (int() refuses 4,300 digits)
            self.fail(f"{text[:20]}... is above {MAX_LIMIT}, the largest limit", param, ctx)
        number = int(text)
        if number < 1:
            self.fail(f"{number} is below 1 (use 'off' to clear it)", param, ctx)
        if number > MAX_LIMIT:
            self.fail(f"{number} is above {MAX_LIMIT}, the largest limit", param, ctx)
        return number


_OFF = object()  # `--rpm off`: no limit
LIMIT = _Limit()


def policy_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The band, limit and cache options of `auth key create` and `auth key limits`."""
    options = [
        click.option(
            "--band",
            type=click.Choice(BANDS),
            help="Priority when every group is full: interactive before standard before "
            "batch (default: standard).",
        ),
        click.option("--rpm", type=LIMIT, help="At most N requests per minute ('off': none)."),
        click.option(
            "--tpm",
            type=LIMIT,
            help="At most N tokens (prompt + completion) per minute ('off': none).",
        ),
        click.option(
            "--budget",
            type=LIMIT,
            help="At most N tokens per --budget-period; then 429 budget_exhausted ('off': none).",
        ),
        click.option(
            "--budget-period", type=click.Choice(PERIODS), help="The budget's UTC calendar period."
        ),
        click.option(
            "--cache-ttl",
            type=LIMIT,
            help="Cache this key's answers for N seconds (exact repeats; 'off': no cache).",
        ),
        click.option(
            "--cache-sampled/--no-cache-sampled",
            default=None,
            help="Also cache answers sampled at a non-zero temperature.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _policy(given: dict[str, Any]) -> dict[str, Any]:
    """The options given, as the key's policy fields (None clears)."""
    names = {
        "band": "band",
        "rpm": "rpm",
        "tpm": "tpm",
        "budget": "budget_tokens",
        "budget_period": "budget_period",
        "cache_ttl": "cache_ttl_s",
        "cache_sampled": "cache_sampled",
    }
    return {
        field: None if given[option] is _OFF else given[option]
        for option, field in names.items()
        if given.get(option) is not None
    }


@scoped(key, "create", scope="main", remote="administrator")
@click.argument("name")
@click.option(
    "--model",
    "models",
    multiple=True,
    help="Allow only this model (name, alias or LoRA adapter); repeat for more. Default: all.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1, max=MAX_LIMIT),
    help="At most this many requests at once with this key.",
)
@policy_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def create(
    ctx: CliContext,
    name: str,
    models: tuple[str, ...],
    concurrency: int | None,
    as_json: bool,
    **given: Any,
) -> None:
    """Create an API key; its secret is printed once and never stored.

    The name of a revoked key may be given again: limits, budgets and usage
    count per name, so the new key carries on what the old one spent (how a
    key is rotated). Another name starts afresh."""
    policy = _policy(given)
    body = {"name": name, "models": list(models), "concurrency": concurrency, **policy}
    made = ask_main(ctx, "POST", "/v1/ops/keys", json=body)
    if made is None:  # no node runs here: write the authority directly
        store = open_authority(ctx.home)
        try:
            made = create_key(store, name, models, concurrency, policy=policy).to_json()
        finally:
            store.close()
    if as_json:
        click.echo(json.dumps(made))
        return
    console.print(f"API key [bold]{made['name']}[/bold] created; it is shown only now:")
    click.echo(made["key"])
    if made.get("succeeds_revoked"):  # (.get: a node of an older release does not say)
        console.print(
            f"  it follows {made['succeeds_revoked']} revoked key(s) named {made['name']}: "
            "what they spent counts against its limits and budget, and usage shows them "
            "as one (a rotation). For an account of its own, use another name.",
            highlight=False,
        )
    if policy and ctx.remote is None:  # (the main's settings are not at hand remotely)
        _note_retention(ctx, made)


@scoped(key, "limits", scope="main", remote="administrator")
@click.argument("name")
@policy_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def limits(ctx: CliContext, name: str, as_json: bool, **given: Any) -> None:
    """Show or change a key's band, rate limits, token budget and response cache.

    With no option it shows them. 'off' clears a limit. With the node running
    its gateway applies the change before this returns; a key's counts (requests
    and tokens of the last minute, tokens of the budget's period) are rebuilt
    from the request records whenever its limits change."""
    change = _policy(given)
    path = f"/v1/ops/keys/{segment(name)}/limits"
    if not change and ctx.remote is not None:
        answer = ask_main(ctx, "GET", path)
    elif not change:
        store = open_authority(ctx.home)
        try:
            answer = key_limits(store, name)
        finally:
            store.close()
    else:
        answer = ask_main(ctx, "POST", path, json=change)
        if answer is None:
            store = open_authority(ctx.home)
            try:
                answer = {"name": name, **policy_json(set_policy(store, name, change))}
            finally:
                store.close()
    if as_json:
        click.echo(json.dumps(answer))
        return
    console.print(f"API key [bold]{name}[/bold]: {limits_text(answer)}", highlight=False)
    if change and ctx.remote is None:  # (the main's settings are not at hand remotely)
        _note_retention(ctx, answer)


# The longest each budget period can be, in days (a month: 31).
_PERIOD_DAYS = {"day": 1, "week": 7, "month": 31}


def _note_retention(ctx: CliContext, policy: dict[str, Any]) -> None:
    """Say when the request records cannot rebuild a key's counts after a
    restart: they are off, or kept for less than its budget period."""
    if not (policy.get("budget_tokens") or policy.get("rpm") or policy.get("tpm")):
        return
    try:
        records = config.load(ctx.home.config_file).requests
    except config.ConfigError:
        return  # (the node says so itself when it starts)
    if not records.enabled:
        click.echo(
            "note: request records are off ([requests] enabled = false): this key's limits "
            "count from zero again at every start of the node",
            err=True,
        )
        return
    period = policy.get("budget_period")
    days = _PERIOD_DAYS.get(period or "", 0) if policy.get("budget_tokens") else 0
    if days > records.keep_days:
        click.echo(
            f"note: request records are kept {records.keep_days} day(s) ([requests] keep_days), "
            f"less than a {period}: after a restart this budget counts only those days",
            err=True,
        )


def limits_text(p: dict[str, Any]) -> str:
    parts = [f"band {p['band']}"]
    parts.append(f"{p['rpm']} requests/min" if p["rpm"] else "no request limit")
    parts.append(f"{p['tpm']} tokens/min" if p["tpm"] else "no token limit")
    budget = p["budget_tokens"]
    parts.append(f"budget {budget} tokens/{p['budget_period']}" if budget else "no budget")
    if p["cache_ttl_s"]:
        sampled = ", sampled too" if p["cache_sampled"] else ""
        parts.append(f"cache {p['cache_ttl_s']}s{sampled}")
    else:
        parts.append("no cache")
    return "; ".join(parts)


@scoped(key, "list", scope="main", remote="administrator")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked keys.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_keys(ctx: CliContext, include_revoked: bool, as_json: bool) -> None:
    """List API keys (names and prefixes, never secrets)."""
    if ctx.remote is not None:
        rows = ask_main(ctx, "GET", f"/v1/ops/keys?all={str(include_revoked).lower()}")
    else:
        store = open_authority(ctx.home)
        try:
            rows = key_listing(store, include_revoked)
        finally:
            store.close()
    if as_json:
        emit(rows, [], as_json=True)
        return
    emit(
        [
            {
                **r,
                "prefix": r["prefix"] + "…",
                "models": ", ".join(r["models"]) or "all",
                "limits": _limits_cell(r),
            }
            for r in rows
        ],
        ["name", "prefix", "models", "concurrency", "band", "limits", "created", "revoked"],
        as_json=False,
        title="API keys",
    )


def _limits_cell(r: dict[str, Any]) -> str:
    cells = []
    if r["rpm"]:
        cells.append(f"{r['rpm']} rpm")
    if r["tpm"]:
        cells.append(f"{r['tpm']} tpm")
    if r["budget_tokens"]:
        cells.append(f"{r['budget_tokens']}/{r['budget_period']}")
    if r["cache_ttl_s"]:
        cells.append(f"cache {r['cache_ttl_s']}s")
    return ", ".join(cells) or "-"


@scoped(key, "revoke", scope="main", remote="administrator")
@click.argument("name")
@click.pass_obj
def revoke(ctx: CliContext, name: str) -> None:
    """Revoke an API key. With the node running, its gateway refuses the key
    from the moment this returns; otherwise from the node's next start."""
    path = f"/v1/ops/keys/{segment(name)}/revoke"
    if ask_main(ctx, "POST", path) is None:
        store = open_authority(ctx.home)
        try:
            revoke_key(store, name)
        finally:
            store.close()
    console.print(f"API key [bold]{name}[/bold] revoked")
