"""`eval run`: one suite run against a model through the main's own gateway,
scored, kept and audited. One function for the CLI on the main and the admin
API (in a worker thread, with its own authority connection as the CLI has):
it says what the CLI prints, so a controller prints the same."""

from __future__ import annotations

from typing import Any

from letsinfer import config
from letsinfer.admission.said import Say
from letsinfer.audit.anchor import open_authority
from letsinfer.evals.key import eval_key
from letsinfer.evals.runner import KEY_WAIT_S, Gateway, Run, run_suite
from letsinfer.evals.shown import case_row, run_row
from letsinfer.evals.suite import Suite
from letsinfer.home import Home
from letsinfer.store import AuthorityStore
from letsinfer.store.evals import EvalCaseRecord


class EvalAskRefused(Exception):
    """A model or group that is not there: refused before any request, naming
    the parameter at fault (the CLI exits 2, as for a bad option)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def main_gateway(settings: config.Settings, secret: str, made_now: bool) -> Gateway:
    """The main's gateway, reached over this host's own address."""
    host = settings.gateway.host
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return Gateway(
        f"http://{shown}:{settings.gateway.port}", secret, key_wait_s=KEY_WAIT_S if made_now else 0
    )


def run_eval(
    home: Home,
    say: Say,
    suite: Suite,
    model: str,
    group: str | None,
    *,
    as_json: bool,
    actor: str = "cli",
    role: str | None = None,
) -> dict[str, Any]:
    """The run as `eval run --json` prints it (EvalAskRefused: nothing was
    sent; letsinfer.evals.runner.EvalError: the run could not be made). Says
    the progress and verdict lines unless ``as_json``."""
    settings = config.load(home.config_file)
    store = open_authority(home)
    try:
        service = store.resolve_service(model)
        if service is None:
            raise EvalAskRefused(f"no model {model!r} (see `letsinfer model list`)", "'MODEL'")
        if group is not None:
            groups = [pg.id for pg in store.list_placement_groups(service=service.name)]
            if group not in groups:
                raise EvalAskRefused(
                    f"model {service.name} has no placement group {group!r} "
                    f"(its groups: {', '.join(groups) or 'none'})",
                    "'--group'",
                )
        secret, made_now = eval_key(store, home, actor)
    finally:
        store.close()
    gateway = main_gateway(settings, secret, made_now)

    def progress(case: EvalCaseRecord) -> None:
        if not as_json:
            mark = "pass" if case.score >= 1 else ("part" if case.score > 0 else "fail")
            say(
                f"  {mark} {case.index}. {case.name}: {case.score:.2f} ({case.note})",
                highlight=False,
            )

    if not as_json:
        say(f"eval {suite.name} ({len(suite.cases)} cases) on {model}", highlight=False)
    try:
        done = run_suite(suite, model, gateway, group, progress)
    finally:
        gateway.close()
    store = open_authority(home)
    try:
        _keep(store, done, actor, role)
    finally:
        store.close()
    r = done.record
    if not as_json:
        verdict = "passed" if r.passed else "FAILED"
        say(
            f"score {r.score:.4f}, threshold {r.threshold:g}: {verdict} (run {r.id})",
            highlight=False,
        )
    return {**run_row(r), "cases": [case_row(c) for c in done.cases]}


def _keep(store: AuthorityStore, done: Run, actor: str, role: str | None) -> None:
    """The run and its cases, and its audit record with the score, together."""
    r = done.record
    with store.transaction():
        store.add_eval_run(r, done.cases)
        detail = (
            f"run={r.id} suite={r.suite} score={r.score:.4f} threshold={r.threshold:g} "
            f"passed={'yes' if r.passed else 'no'}" + (f" group={r.pg}" if r.pg else "")
        )
        store.append_audit(actor, "eval.run", "ok", role=role, target=r.model, detail=detail)
