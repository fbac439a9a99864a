"""The ``letsinfer`` command: day-2 operations, each leaf with a declared scope."""

from __future__ import annotations

from typing import Any

import click

from letsinfer import __version__
from letsinfer.cli.scope import load_context
from letsinfer.config import ConfigError
from letsinfer.contracts.artifacts import ModelFileError
from letsinfer.store import StoreError


class _Root(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (StoreError, ModelFileError) as exc:
            raise click.ClickException(str(exc)) from exc
        except ConfigError as exc:
            err = click.ClickException(str(exc))
            err.exit_code = 2
            raise err from exc


@click.group(cls=_Root)
@click.version_option(__version__, prog_name="letsinfer")
@click.option(
    "--home",
    envvar="LETSINFER_HOME",
    metavar="DIR",
    help="Keep all of this node's files under DIR (default: /etc, /var/lib and "
    "/run as root, ~/.local/share/letsinfer otherwise).",
)
@click.pass_context
def cli(ctx: click.Context, home: str | None) -> None:
    """letsinfer: a few machines with GPUs (or none) as one OpenAI-compatible service."""
    ctx.obj = load_context(home)


def main() -> None:
    from letsinfer.cli import (  # noqa: F401  (registers commands)
        audit,
        auth,
        bundle,
        cluster,
        controller,
        doctor,
        fleet,
        mirror,
        model,
        model_adapter,
        model_fallback,
        model_lifecycle,
        model_plan,
        model_pull,
        node,
        release,
        service,
        status,
        storage,
        top,
        up,
        usage,
    )

    cli(prog_name="letsinfer")
