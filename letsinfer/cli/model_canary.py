"""``letsinfer model promote|abort|canary``: finishing or ending a model's
canary (``model upgrade|update --canary``: one new group taking a share of
its requests), and comparing both sides before choosing."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from letsinfer.cli.local import segment
from letsinfer.cli.model import model
from letsinfer.cli.model_install import report_rollout
from letsinfer.cli.output import console
from letsinfer.cli.remote import ask_main, call
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.cli.shown import read_store

_NEEDS_NODE = (
    "no node runs on this home: {what} drains placement groups through the running main. "
    "Start it (`letsinfer up`, or `letsinfer service start`) and run this again"
)


@scoped(model, "promote", scope="main", remote="operator")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def promote(ctx: CliContext, name: str, as_json: bool) -> None:
    """Keep a model's canary and move the rest of it: the group the canary
    stands beside drains and goes, then every other group follows one at a
    time, as `letsinfer model upgrade` (or `model update`) does. With a gate
    (`letsinfer model gate`) the canary's group is judged first: below the
    score nothing changes, the canary stays as it was, and it exits 1.
    Exits 1 naming a group that failed."""
    answer = ask_main(ctx, "POST", f"/v1/ops/models/{segment(name)}/promote", timeout=None)
    if answer is None:
        raise click.ClickException(_NEEDS_NODE.format(what="a promotion"))
    if not as_json:
        console.print(f"promotion of {answer['model']}'s canary:", highlight=False)
    report_rollout(answer, as_json)


@scoped(model, "abort", scope="main", remote="operator")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def abort(ctx: CliContext, name: str, as_json: bool) -> None:
    """End a model's canary: its group drains and goes, and every request
    returns to the model's other groups, which never changed."""
    answer = ask_main(ctx, "POST", f"/v1/ops/models/{segment(name)}/abort", timeout=None)
    if answer is None:
        raise click.ClickException(_NEEDS_NODE.format(what="an abort"))
    if not as_json:
        console.print(f"canary of {answer['model']} aborted:", highlight=False)
    report_rollout(answer, as_json)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


@scoped(model, "canary", scope="main", remote="viewer")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def canary(ctx: CliContext, name: str, as_json: bool) -> None:
    """Both sides of a model's canary since it started, from the request
    records (which group answered each request) and eval runs pinned to a
    group (`letsinfer eval MODEL --group PG`): requests, their share, errors
    (status 400 and above), latency p50/p95, and the latest eval score."""
    if ctx.remote is not None:
        answer: dict[str, Any] = call(ctx.remote, "GET", f"/v1/ops/models/{segment(name)}/canary")
    else:
        from letsinfer.lifecycle.canary import report
        from letsinfer.lifecycle.rollout import RolloutRefused

        store = read_store(ctx.home)
        try:
            answer = report(store, ctx.home.requests_database, name)
        except RolloutRefused as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            store.close()
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    since = datetime.fromtimestamp(answer["started_at"]).strftime("%Y-%m-%d %H:%M:%S")
    console.print(
        f"canary of {answer['model']}: {answer['group']} runs {answer['change']} and takes "
        f"{answer['percent']:g}% of requests (since {since}, by {answer['started_by']})",
        highlight=False,
    )
    for side in ("canary", "stable"):
        s = answer[side]
        score = s["eval"]
        said = (
            f"{score['suite']} {score['score']:.2f} ({'passed' if score['passed'] else 'failed'})"
            if score
            else "no eval run pinned to its groups"
        )
        console.print(
            f"  {side:<6} {', '.join(s['groups']) or '-'}: {s['requests']} request(s)"
            f" ({_rate(s['share'])}), errors {_rate(s['error_rate'])}, "
            f"p50 {_ms(s['latency_ms']['p50'])}, p95 {_ms(s['latency_ms']['p95'])}, eval {said}",
            highlight=False,
        )
