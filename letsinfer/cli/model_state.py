"""``letsinfer model stop``, ``start`` and ``resume``: whether a model's
groups run."""

from __future__ import annotations

from typing import Any

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority import lifecycle
from letsinfer.authority.links import ResumeRefused, resume_model
from letsinfer.cli import settling
from letsinfer.cli.local import segment
from letsinfer.cli.model import model, refuse_adapter_name
from letsinfer.cli.output import console
from letsinfer.cli.remote import ask_main
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.storage import refetch

# How long `model stop` waits for engines to be gone: a child's agent reports
# it with its next facts, an engine stops within seconds of SIGTERM.
STOP_WAIT_S = 60.0


def _set_desired(ctx: CliContext, name: str, desired: str) -> dict[str, Any]:
    """Ask for it (the main from a controller, the running node, else the
    authority directly); the answer."""
    verb = "start" if desired == "running" else "stop"
    if ctx.remote is None:  # (the main says it itself)
        refuse_adapter_name(ctx, name, verb)
    answer = ask_main(ctx, "POST", f"/v1/ops/models/{segment(name)}/{verb}")
    if answer is None:  # no node runs here: write the authority directly
        store = open_authority(ctx.home)
        try:
            answer = lifecycle.set_model_desired(store, name, desired, actor="cli").to_json()
            if desired == "running":
                answer["downloads"] = refetch.downloads(store, answer["model"])
        finally:
            store.close()
    for d in answer.get("downloads", []):  # its file was released there (`node cleanup`)
        console.print(
            f"{d['node']} downloads sha256:{d['artifact']} again and verifies it "
            "before its placement group serves",
            soft_wrap=True,
        )
    return answer


def report_model(now: settling.ModelNow) -> None:
    """The model's state and each group's, as `model show` shows them."""
    console.print(f"model {now.model}: {now.state}", highlight=False)
    if now.state == "not placed":
        console.print(
            f"  no placement group runs it: `letsinfer model install {now.model}` places it",
            highlight=False,
        )
    for g in now.groups:
        why = f": {g.detail}" if g.detail and g.state not in ("ready", "stopped") else ""
        console.print(f"  {g.id} on {g.node}: {g.state}{why}", highlight=False)


@scoped(model, "stop", scope="main", remote="operator")
@click.argument("name")
@click.pass_obj
def stop(ctx: CliContext, name: str) -> None:
    """Stop every placement group of a model (engines stop; nothing is deleted).

    Returns once every group's engine is gone (or says which are still
    stopping after a minute)."""
    model_name = str(_set_desired(ctx, name, "stopped")["model"])
    now = settling.settle(ctx, model_name, lambda m: m.settled, STOP_WAIT_S)
    report_model(now)


@scoped(model, "start", scope="main", remote="operator")
@click.argument("name")
@click.option(
    "--wait",
    is_flag=True,
    help="Return once every placement group is ready, or has stopped trying "
    "(parked, failed), within [lifecycle] start_timeout_s.",
)
@click.pass_obj
def start(ctx: CliContext, name: str, wait: bool) -> None:
    """Start a model's placement groups again (parked ones start afresh).

    Without --wait it returns at once and says which groups are still
    starting; until one is ready, requests for the model get 503
    no_healthy_replica (retry shortly)."""
    answer = _set_desired(ctx, name, "running")
    model_name = str(answer["model"])
    if not wait:
        now = settling.model_now(ctx, model_name)
        report_model(now)
        if not now.settled:
            console.print(
                f"`letsinfer model start {model_name} --wait` waits until it serves",
                highlight=False,
            )
        return
    timeout = answer.get("start_timeout_s") or (
        config.load(ctx.home.config_file).lifecycle.start_timeout_s
    )
    now = settling.settle(ctx, model_name, lambda m: m.settled, timeout)
    report_model(now)
    if now.state != "serving":
        raise click.ClickException(
            f"model {model_name} is {now.state}"
            + (f" after {timeout:.0f}s" if not now.settled else "")
        )


@scoped(model, "resume", scope="main", remote="operator")
@click.argument("name")
@click.pass_obj
def resume(ctx: CliContext, name: str) -> None:
    """Resume placement groups paused by a lost data link (an explicit step), once
    every link they need is proven again; also starts stopped groups."""
    if ctx.remote is None:  # (the main says it itself)
        refuse_adapter_name(ctx, name, "resume")
    answer = ask_main(ctx, "POST", f"/v1/ops/models/{segment(name)}/resume")
    if answer is None:
        store = open_authority(ctx.home)
        try:
            done = resume_model(store, name, actor="cli")
        except ResumeRefused as exc:
            raise click.ClickException(f"{exc}. Nothing changed.") from exc
        finally:
            store.close()
        answer = done.to_json()
    unpaused = answer["unpaused"]
    if unpaused:
        console.print(f"unpaused: {', '.join(unpaused)}", highlight=False)
    report_model(settling.model_now(ctx, answer["model"]))
