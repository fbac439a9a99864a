"""``letsinfer model add --external``: a model an OpenAI-compatible provider
serves, and how `model list` and `model show` describe it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext


def external_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of `model add` for a model an external provider serves."""
    options = [
        click.option(
            "--external",
            "url",
            metavar="URL",
            help="An OpenAI-compatible provider's API base (e.g. https://api.example.com/v1): "
            "publish its model under NAME instead of running an engine.",
        ),
        click.option(
            "--provider-model",
            metavar="M",
            help="The provider's name for the model (default: NAME).",
        ),
        click.option(
            "--key-file",
            type=click.Path(path_type=Path),
            help="A private file (not readable by others) holding the provider's API key; the "
            "gateway reads it for each request and never stores or logs the key.",
        ),
        click.option(
            "--ca-file",
            type=click.Path(path_type=Path),
            help="Verify the provider's TLS certificate against this CA (default: the "
            "system's CAs). Verification cannot be turned off.",
        ),
        click.option(
            "--concurrency",
            type=click.IntRange(1, 4096),
            help="At most this many requests at the provider at once (default 64).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def add_external(
    ctx: CliContext,
    name: str,
    aliases: tuple[str, ...],
    fallback: str | None,
    *,
    url: str,
    provider_model: str | None,
    key_file: Path | None,
    ca_file: Path | None,
    concurrency: int | None,
) -> None:
    # Here, not at the top: `model list` and `model show` use this module's
    # description of an external model and must not load the signing code.
    from letsinfer import config
    from letsinfer.audit.anchor import open_authority
    from letsinfer.authority.external import add_external_model
    from letsinfer.fetch import FetchPolicy

    policy = FetchPolicy.from_settings(config.load(ctx.home.config_file))
    store = open_authority(ctx.home)
    try:
        svc = add_external_model(
            store,
            name,
            url,
            provider_model or name,
            key_file,
            ca_file=ca_file,
            concurrency=concurrency,
            aliases=aliases,
            fallback=fallback,
            policy=policy,
        )
    finally:
        store.close()
    assert svc.external is not None
    ext = svc.external
    console.print(
        f"added model [bold]{svc.name}[/bold]: {ext['provider_model']} at {ext['url']}",
        highlight=False,
    )
    if urlsplit(ext["url"]).scheme == "http" and ext["key_file"]:
        console.print(
            "[yellow]warning[/yellow]: the provider's key travels unencrypted over http://"
        )


def show_external(info: dict[str, Any]) -> None:
    ext = info.get("external")
    if ext:
        console.print(f"  provider {ext['url']} (model {ext['provider_model']})", highlight=False)
        console.print(f"  key file {ext['key_file'] or '-'}", highlight=False)
        if ext.get("ca_file"):
            console.print(f"  CA file  {ext['ca_file']}", highlight=False)
        if ext.get("concurrency"):
            console.print(f"  at most  {ext['concurrency']} requests at once", highlight=False)
    if info.get("fallback"):
        console.print(f"  fallback {info['fallback']}", highlight=False)
    if info.get("adapters"):
        console.print(f"  adapters {', '.join(info['adapters'])}", highlight=False)
