"""``letsinfer model scale``: how many groups a model keeps, and when it loads
and unloads (letsinfer.capacity)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from letsinfer.cli.local import segment
from letsinfer.cli.model import model
from letsinfer.cli.output import console, emit_object
from letsinfer.cli.remote import ask_main
from letsinfer.cli.scope import CliContext, scoped


def _duration(what: str) -> Callable[[click.Context, click.Parameter, str | None], float | None]:
    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
        from letsinfer.capacity.policy import PolicyError, parse_duration

        if value is None:
            return None
        try:
            return parse_duration(value, what)
        except PolicyError as exc:
            raise click.BadParameter(str(exc).split(": ", 1)[1]) from exc

    return parse


def scale_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The policy's options, shared by `model scale`, `add`, `pull` and `install`."""
    for option in reversed(
        (
            click.option(
                "--min",
                "min_groups",
                type=click.IntRange(0, 64),
                help="Groups always loaded (pinned: never unloaded nor evicted); "
                "0: on demand, loaded at its first request.",
            ),
            click.option(
                "--max", "max_groups", type=click.IntRange(1, 64), help="At most this many groups."
            ),
            click.option(
                "--idle",
                "idle_s",
                metavar="DURATION",
                callback=_duration("--idle"),
                help="On demand: unload after this long without a request (e.g. 5m; default 5m).",
            ),
            click.option(
                "--min-resident",
                "min_resident_s",
                metavar="DURATION",
                callback=_duration("--min-resident"),
                help="Never unloaded nor evicted sooner after a load (default 10s): "
                "two models that cannot fit together swap at most once per this time.",
            ),
            click.option(
                "--target-inflight",
                "target_inflight",
                type=click.FloatRange(min=0, min_open=True, max=10_000),
                help="Requests in flight per group above which a group is added (default 4).",
            ),
            click.option(
                "--scale-down",
                "scale_down_s",
                metavar="DURATION",
                callback=_duration("--scale-down"),
                help="Calm this long before one group fewer (default 2m).",
            ),
        )
    ):
        fn = option(fn)
    return fn


def policy_change(**given: Any) -> dict[str, Any]:
    return {k: v for k, v in given.items() if v is not None}


def checked_policy(given: dict[str, Any]) -> dict[str, Any]:
    """The scaling options a command that adds or places a model was given,
    refused before anything changes when they cannot make a policy."""
    from letsinfer.capacity.policy import DEFAULT, PolicyError
    from letsinfer.capacity.setting import resolve

    change = policy_change(**given)
    try:
        resolve(DEFAULT, change)
    except PolicyError as exc:
        raise click.UsageError(f"{exc}. Nothing changed.") from exc
    return change


def said_policy(ctx: CliContext, name: str, change: dict[str, Any]) -> None:
    """Set the policy of a model just added or placed, and say it."""
    if change:
        answer = apply_policy(ctx, name, change)
        console.print(f"model {answer['model']}: {answer['summary']}", highlight=False)


def apply_policy(ctx: CliContext, name: str, change: dict[str, Any]) -> dict[str, Any]:
    """Through the running node (it acts on it before this returns), else
    straight into the authority."""
    answer = ask_main(ctx, "POST", f"/v1/ops/models/{segment(name)}/scale", json=change)
    if answer is not None:
        return answer
    from letsinfer.audit.anchor import open_authority
    from letsinfer.capacity.setting import set_policy

    store = open_authority(ctx.home)
    try:
        canonical, policy = set_policy(store, name, change)
    finally:
        store.close()
    return {"model": canonical, "policy": policy.to_json(), "summary": policy.describe()}


@scoped(model, "scale", scope="main", remote="operator")
@click.argument("name")
@scale_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (one object).")
@click.pass_obj
def scale(ctx: CliContext, name: str, as_json: bool, **given: Any) -> None:
    """Show or set how many placement groups NAME keeps and when it loads.

    With no option, shows the policy. `--min 0` loads the model at its first
    request (which waits while it loads) and unloads it after `--idle`
    without one; `--min 1` or more keeps that many loaded, never evicted.
    Between `--min` and `--max` a group is added while requests in flight per
    group stay above `--target-inflight`, and one is removed after a calm
    `--scale-down`. The default, one group always loaded, is what `model
    add` gives."""
    change = policy_change(**given)
    if change:
        answer = apply_policy(ctx, name, change)
    elif ctx.remote is not None:
        answer = ask_main(ctx, "GET", f"/v1/ops/models/{segment(name)}/scale")
    else:
        from letsinfer.cli.shown import read_store

        store = read_store(ctx.home)
        try:
            svc = store.resolve_service(name)
            if svc is None:
                raise click.ClickException(f"no model {name!r} (see `letsinfer model list`)")
            policy = store.scaling_policy(svc.name)
        finally:
            store.close()
        answer = {"model": svc.name, "policy": policy.to_json(), "summary": policy.describe()}
    if as_json:
        emit_object(answer)
        return
    console.print(f"model {answer['model']}: {answer['summary']}", highlight=False)
