"""``letsinfer model gate``: the suite and score a model's updates and
upgrades must reach before its new weights or release serve (docs/models.md,
"Gates"); and the ``--eval S --min-score X`` options that give a gate to one
``model update`` or ``model upgrade``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from letsinfer.audit.anchor import open_authority
from letsinfer.cli.local import segment
from letsinfer.cli.model import model
from letsinfer.cli.output import console, emit_object
from letsinfer.cli.remote import admit, ask_main
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.evals.gate import GateSpec, check_min_score, read_spec
from letsinfer.evals.gate_setting import GateRefused, change_gate
from letsinfer.evals.suite import SuiteError, builtin_names

_MIN_SCORE = click.FloatRange(0.0, 1.0)


def gate_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--eval S --min-score X`: this command's gate (instead of the model's own)."""
    suite = click.option(
        "--eval",
        "eval_suite",
        metavar="FILE|NAME",
        help="Before any group leaves (with --canary: before the canary takes its share), "
        "run this eval suite against the first new group while it takes no client's "
        "request; below --min-score it is removed, the old serves on and the command "
        "exits 1 (default: the model's gate, `model gate`).",
    )
    score = click.option(
        "--min-score",
        type=_MIN_SCORE,
        metavar="X",
        help="The score (0 to 1) the --eval suite must reach.",
    )
    return suite(score(command))


def canary_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--canary PERCENT` of `model upgrade` and `model update` (``what``: what the
    new group runs)."""
    return click.option(
        "--canary",
        "canary",
        type=click.FloatRange(0, 100, min_open=True, max_open=True),
        metavar="PERCENT",
        help=f"Start one new group on {what} beside the others and give it this share of "
        "the model's requests, until `letsinfer model promote` (the rest follow) or "
        "`letsinfer model abort` (it goes); `letsinfer model canary` compares both sides.",
    )


def given_gate(eval_suite: str | None, min_score: float | None) -> dict[str, Any] | None:
    """The gate to send with the request (the suite file read now), or None."""
    if eval_suite is None and min_score is None:
        return None
    if eval_suite is None or min_score is None:
        raise click.UsageError("--eval and --min-score go together")
    try:
        spec = read_spec(eval_suite, min_score)
    except SuiteError as exc:
        raise click.BadParameter(str(exc), param_hint="'--eval'") from None
    return {"suite": spec.suite, "min_score": spec.min_score, "text": spec.text}


@scoped(model, "gate", scope="main", remote="viewer")
@click.argument("name")
@click.option(
    "--suite",
    metavar="FILE|NAME",
    help="The eval suite new weights or releases must pass: a suite file (read by the "
    f"main's service at each update) or a built-in suite: {', '.join(builtin_names())}. "
    "From a controller: a built-in suite.",
)
@click.option("--min-score", type=_MIN_SCORE, metavar="X", help="The score (0 to 1) to reach.")
@click.option("--clear", is_flag=True, help="Remove the model's gate.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def gate(
    ctx: CliContext,
    name: str,
    suite: str | None,
    min_score: float | None,
    clear: bool,
    as_json: bool,
) -> None:
    """Show, set (--suite S --min-score X) or clear (--clear) a model's gate: every
    `model update` and `model upgrade` first runs the suite against the first new
    group, which takes no client's request meanwhile; below the score it is
    removed, the old keeps serving, and the command exits 1. A canary
    (--canary) is judged before it takes its share, and again by `model
    promote`: below the score the promotion is refused and the canary stays
    as it was (`model abort` removes it). Each run is audited with its score
    (`letsinfer audit list`, `letsinfer eval runs`). From a controller,
    setting or clearing needs the operator role."""
    setting = suite is not None or min_score is not None
    if clear and setting:
        raise click.UsageError("--clear takes no --suite or --min-score")
    if setting and (suite is None or min_score is None):
        raise click.UsageError("--suite and --min-score go together")
    spec: GateSpec | None = None
    if setting:
        assert suite is not None and min_score is not None
        if ctx.remote is not None and suite not in builtin_names():
            # A suite file is read by the main's service: a workstation's path
            # means nothing there, and the main opens no path a controller names.
            raise click.BadParameter(
                f"{suite!r}: from a controller, a gate's suite is a built-in one "
                f"({', '.join(builtin_names())}); set a suite file's gate on the main. "
                "Nothing was sent.",
                param_hint="'--suite'",
            )
        try:
            check_min_score(min_score)
            spec = read_spec(suite, min_score)
        except SuiteError as exc:
            raise click.BadParameter(str(exc), param_hint="'--suite'") from None
    if ctx.remote is not None:
        shown = remote_gate(ctx, name, spec, clear)
    else:
        store = open_authority(ctx.home)
        try:
            shown = change_gate(store, name, spec, clear, "cli")
        except GateRefused as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            store.close()
    cleared = shown.pop("cleared", None)
    if as_json:
        emit_object(shown)
        return
    if clear:
        said = "cleared" if cleared else "had none; nothing changed"
        console.print(f"gate of {shown['model']}: {said}", highlight=False)
    if shown["suite"] is None:
        if not clear:
            console.print(f"model {shown['model']} has no gate", highlight=False)
    else:
        console.print(
            f"gate of {shown['model']}: suite {shown['suite']}, min score "
            f"{shown['min_score']:g} (set {shown['set_at']})",
            highlight=False,
        )


def remote_gate(ctx: CliContext, name: str, spec: GateSpec | None, clear: bool) -> dict[str, Any]:
    """The main's answer; a change first admitted for the operator role (a
    viewer's attempt is refused here, the main told of it)."""
    where = f"/v1/ops/models/{segment(name)}/gate"
    if spec is None and not clear:
        return ask_main(ctx, "GET", where)  # type: ignore[no-any-return]
    admit(ctx.remote, "model gate", "operator")
    if clear:
        return ask_main(ctx, "POST", f"{where}/clear")  # type: ignore[no-any-return]
    assert spec is not None
    body = {"suite": spec.suite, "min_score": spec.min_score}
    return ask_main(ctx, "POST", where, json=body)  # type: ignore[no-any-return]
