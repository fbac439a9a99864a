"""``letsinfer eval``: run an eval suite against a model through the main's
gateway, and look back at the runs kept (docs/evals.md).

``letsinfer eval MODEL --suite FILE|NAME`` is ``letsinfer eval run ...``.
Exit status: 0 at or above the suite's threshold, 1 below it (or when the
run could not be made), 2 for a suite that cannot run (it says the line and
field) or a model or group that does not exist.
"""

from __future__ import annotations

import sys
from urllib.parse import urlencode

import click

from letsinfer.audit.anchor import open_authority
from letsinfer.cli import cli
from letsinfer.cli.local import segment
from letsinfer.cli.output import emit, emit_object
from letsinfer.cli.remote import call
from letsinfer.cli.said import replay, say_here
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.evals.runner import EvalError
from letsinfer.evals.running import EvalAskRefused, run_eval
from letsinfer.evals.shown import no_run, run_row, run_shown
from letsinfer.evals.suite import SuiteError, builtin_names, load


class _EvalGroup(click.Group):
    """``eval MODEL ...`` runs a suite (``eval run MODEL ...``); ``eval runs``
    and ``eval show`` look back."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


@cli.group("eval", cls=_EvalGroup)
def eval_() -> None:
    """Eval suites: run one against a model through the gateway, list and show runs.

    `letsinfer eval MODEL --suite FILE|NAME` runs a suite (see `eval run`)."""


_CASE_COLUMNS = ["case", "name", "scorer", "weight", "score", "note", "request_id"]


@scoped(eval_, "run", scope="main", remote="operator")
@click.argument("model")
@click.option(
    "--suite",
    "suite_name",
    required=True,
    metavar="FILE|NAME",
    help="A suite file (YAML, or JSON lines: .jsonl), or a built-in suite: "
    f"{', '.join(builtin_names())}. From a controller: a built-in suite.",
)
@click.option(
    "--group", metavar="PG", help="Send every case to this placement group of MODEL only."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def run(ctx: CliContext, model: str, suite_name: str, group: str | None, as_json: bool) -> None:
    """Run a suite's cases against MODEL through the main's gateway, score them,
    keep the run, and exit 1 when the score is below the suite's threshold.

    Each case is a real request with the main's own eval key (tag `eval`, id
    `eval-RUN-CASE`); --group pins them to one placement group of MODEL."""
    if ctx.remote is not None and suite_name not in builtin_names():
        # A workstation's path means nothing on the main, and the main opens
        # no path a controller names.
        raise click.BadParameter(
            f"{suite_name!r}: from a controller, an eval's suite is a built-in one "
            f"({', '.join(builtin_names())}); run a suite file on the main. Nothing was sent.",
            param_hint="'--suite'",
        )
    try:
        suite = load(suite_name)
    except SuiteError as exc:
        raise click.BadParameter(str(exc), param_hint="'--suite'") from None
    if ctx.remote is not None:  # run on the main, against its gateway
        answer = call(
            ctx.remote,
            "POST",
            "/v1/ops/evals",
            {"model": model, "suite": suite_name, "group": group, "as_json": as_json},
            timeout=None,
        )
        replay(answer.pop("said"))
        done = answer["run"]
    else:
        try:
            done = run_eval(ctx.home, say_here, suite, model, group, as_json=as_json)
        except EvalAskRefused as exc:
            raise click.BadParameter(str(exc), param_hint=exc.param) from None
        except EvalError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        emit_object(done)
    if not done["passed"]:
        sys.exit(1)


@scoped(eval_, "runs", scope="main", remote="viewer")
@click.option("--model", help="Only runs against this model.")
@click.option(
    "--limit",
    type=click.IntRange(1, 10000),
    default=50,
    show_default=True,
    help="At most this many runs.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def runs(ctx: CliContext, model: str | None, limit: int, as_json: bool) -> None:
    """The eval runs kept, the latest first."""
    if ctx.remote is not None:
        query = urlencode({"limit": limit, **({"model": model} if model else {})})
        rows = call(ctx.remote, "GET", f"/v1/ops/evals?{query}")
    else:
        store = open_authority(ctx.home)
        try:
            rows = [run_row(r) for r in store.list_eval_runs(model, limit)]
        finally:
            store.close()
    columns = ["run", "started", "model", "group", "suite", "cases", "score", "threshold", "passed"]
    emit(rows, columns, as_json=as_json, title="eval runs")


@scoped(eval_, "show", scope="main", remote="viewer")
@click.argument("run_id", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def show(ctx: CliContext, run_id: str, as_json: bool) -> None:
    """One eval run and each of its cases (RUN: its id, or the start of it)."""
    if ctx.remote is not None:
        shown = call(ctx.remote, "GET", f"/v1/ops/evals/{segment(run_id)}")
    else:
        store = open_authority(ctx.home)
        try:
            found = store.get_eval_run(run_id)
        finally:
            store.close()
        if found is None:
            raise click.ClickException(no_run(run_id))
        shown = run_shown(*found)
    run, cases = shown["run"], shown["cases"]
    if as_json:
        emit_object({**run, "cases": cases})
        return
    emit(
        [{"field": k, "value": v} for k, v in run.items()],
        ["field", "value"],
        as_json=False,
        title=f"eval run {run['run']}",
    )
    emit(cases, _CASE_COLUMNS, as_json=False, title="cases")
