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

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.cli import cli
from letsinfer.cli.local import segment
from letsinfer.cli.output import console, emit, emit_object
from letsinfer.cli.remote import call
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.evals.key import eval_key
from letsinfer.evals.runner import KEY_WAIT_S, EvalError, Gateway, Run, run_suite
from letsinfer.evals.shown import case_row, no_run, run_row, run_shown
from letsinfer.evals.suite import SuiteError, builtin_names, load
from letsinfer.store.evals import EvalCaseRecord


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


@scoped(eval_, "run", scope="main")
@click.argument("model")
@click.option(
    "--suite",
    "suite_name",
    required=True,
    metavar="FILE|NAME",
    help="A suite file (YAML, or JSON lines: .jsonl), or a built-in suite: "
    f"{', '.join(builtin_names())}.",
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
    try:
        suite = load(suite_name)
    except SuiteError as exc:
        raise click.BadParameter(str(exc), param_hint="'--suite'") from None
    settings = config.load(ctx.home.config_file)
    store = open_authority(ctx.home)
    try:
        service = store.resolve_service(model)
        if service is None:
            raise click.BadParameter(
                f"no model {model!r} (see `letsinfer model list`)", param_hint="'MODEL'"
            )
        if group is not None:
            groups = [pg.id for pg in store.list_placement_groups(service=service.name)]
            if group not in groups:
                raise click.BadParameter(
                    f"model {service.name} has no placement group {group!r} "
                    f"(its groups: {', '.join(groups) or 'none'})",
                    param_hint="'--group'",
                )
        secret, made_now = eval_key(store, ctx.home)
    finally:
        store.close()
    host = settings.gateway.host
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    gateway = Gateway(
        f"http://{shown}:{settings.gateway.port}", secret, key_wait_s=KEY_WAIT_S if made_now else 0
    )

    def progress(case: EvalCaseRecord) -> None:
        if not as_json:
            mark = "pass" if case.score >= 1 else ("part" if case.score > 0 else "fail")
            console.print(
                f"  {mark} {case.index}. {case.name}: {case.score:.2f} ({case.note})",
                highlight=False,
            )

    if not as_json:
        console.print(f"eval {suite.name} ({len(suite.cases)} cases) on {model}", highlight=False)
    try:
        done = run_suite(suite, model, gateway, group, progress)
    except EvalError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        gateway.close()
    _keep(ctx, done)
    r = done.record
    if as_json:
        emit_object({**run_row(r), "cases": [case_row(c) for c in done.cases]})
    else:
        verdict = "passed" if r.passed else "FAILED"
        console.print(
            f"score {r.score:.4f}, threshold {r.threshold:g}: {verdict} (run {r.id})",
            highlight=False,
        )
    if not r.passed:
        sys.exit(1)


def _keep(ctx: CliContext, done: Run) -> None:
    """The run and its cases, and its audit record with the score, together."""
    r = done.record
    store = open_authority(ctx.home)
    try:
        with store.transaction():
            store.add_eval_run(r, done.cases)
            detail = (
                f"run={r.id} suite={r.suite} score={r.score:.4f} threshold={r.threshold:g} "
                f"passed={'yes' if r.passed else 'no'}" + (f" group={r.pg}" if r.pg else "")
            )
            store.append_audit("cli", "eval.run", "ok", target=r.model, detail=detail)
    finally:
        store.close()


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
