"""``letsinfer project``: projects group portal accounts and their keys; a
project's models bound every key in it, and its limits (rpm, tpm, a token
budget per period) are shared by all of them (docs/portal.md)."""

from __future__ import annotations

from typing import Any

import click

from letsinfer.audit.anchor import open_authority
from letsinfer.authority import people
from letsinfer.authority.apikeys import BANDS, PERIODS
from letsinfer.cli import cli
from letsinfer.cli.auth import _OFF, LIMIT
from letsinfer.cli.output import console, emit, emit_object
from letsinfer.cli.scope import SHELL_ONLY, CliContext, scoped
from letsinfer.cli.user import applied, changed

COLUMNS = ["name", "models", "band", "rpm", "tpm", "budget_tokens", "budget_period", "members"]


@cli.group()
def project() -> None:
    """Projects: members, models and the limits their keys share."""


def limit_options(fn: Any) -> Any:
    options = [
        click.option("--band", type=click.Choice(BANDS), help="The band of every key in it."),
        click.option("--rpm", type=LIMIT, help="At most N requests per minute, all its keys."),
        click.option("--tpm", type=LIMIT, help="At most N tokens per minute, all its keys."),
        click.option("--budget", type=LIMIT, help="At most N tokens per --budget-period."),
        click.option("--budget-period", type=click.Choice(PERIODS), help="The budget's period."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _policy(band: str | None, **given: Any) -> dict[str, Any]:
    names = {
        "rpm": "rpm",
        "tpm": "tpm",
        "budget": "budget_tokens",
        "budget_period": "budget_period",
    }
    out = {
        field: None if given[option] is _OFF else given[option]
        for option, field in names.items()
        if given.get(option) is not None
    }
    if band is not None:
        out["band"] = band
    return out


def _row(shown: dict[str, Any]) -> dict[str, Any]:
    return {
        **shown,
        "models": ",".join(shown["models"]) or "all",
        "members": ",".join(shown["members"]),
    }


@scoped(project, "create", scope="main", remote=SHELL_ONLY)
@click.argument("name")
@click.option("--model", "models", multiple=True, help="A model it may use; repeat. Default: all.")
@limit_options
@click.pass_obj
def create(
    ctx: CliContext, name: str, models: tuple[str, ...], band: str | None, **given: Any
) -> None:
    """Create project NAME."""
    store = open_authority(ctx.home)
    try:
        people.create_project(store, name, models, _policy(band, **given))
    finally:
        store.close()
    console.print(f"project {name} created")


@scoped(project, "list", scope="main", remote=SHELL_ONLY)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_projects(ctx: CliContext, as_json: bool) -> None:
    """Projects, their models, limits and members."""
    store = open_authority(ctx.home)
    try:
        rows = [people.project_json(store, p) for p in store.list_projects()]
    finally:
        store.close()
    emit(rows if as_json else [_row(r) for r in rows], COLUMNS, as_json=as_json, title="projects")


@scoped(project, "show", scope="main", remote=SHELL_ONLY)
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def show(ctx: CliContext, name: str, as_json: bool) -> None:
    """One project: models, limits, members and keys."""
    store = open_authority(ctx.home)
    try:
        found = store.get_project(name)
        if found is None:
            raise click.ClickException(f"no project named {name!r} (see `letsinfer project list`)")
        shown = people.project_json(store, found)
    finally:
        store.close()
    if as_json:
        emit_object(shown)
        return
    for field, value in shown.items():
        text = ",".join(value) if isinstance(value, list) else value
        console.print(f"{field}: {'-' if text in (None, '') else text}", highlight=False)


@scoped(project, "limits", scope="main", remote=SHELL_ONLY)
@click.argument("name")
@click.option("--model", "models", multiple=True, help="Replace its models; repeat.")
@click.option("--all-models", is_flag=True, help="Let it use every model.")
@limit_options
@click.pass_obj
def limits(
    ctx: CliContext,
    name: str,
    models: tuple[str, ...],
    all_models: bool,
    band: str | None,
    **given: Any,
) -> None:
    """Change NAME's models or limits ('off' clears a limit); its keys follow at once."""
    if models and all_models:
        raise click.UsageError("--model and --all-models contradict each other")
    store = open_authority(ctx.home)
    try:
        listed = () if all_models else (models or None)
        people.set_project_limits(store, name, _policy(band, **given), listed)
    finally:
        store.close()
    applied(ctx)
    console.print(f"project {name} changed")


@scoped(project, "remove", scope="main", remote=SHELL_ONLY)
@click.argument("name")
@click.pass_obj
def remove(ctx: CliContext, name: str) -> None:
    """Remove NAME (refused while it has members or active keys)."""
    changed(ctx, people.remove_project, name)
    console.print(f"project {name} removed")
