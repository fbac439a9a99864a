"""``letsinfer service``: run this node in the background without systemd.

Where systemd runs, use its unit (the Ansible ``node`` role installs one); on
machines without it this is letsinfer's own supervisor: a detached
``letsinfer up`` with its output in ``<var>/logs/node.log``. ``service
restart`` works with both: it keeps the node's engines serving.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from letsinfer import config, service
from letsinfer.cli import cli
from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext, scoped


def _home_option() -> str | None:
    value = click.get_current_context().find_root().params.get("home")
    return str(value) if value else None


def _raise(exc: service.ServiceError) -> None:
    raise click.ClickException(str(exc)) from exc


@cli.group("service")
def service_group() -> None:
    """Run this node in the background: start, stop, status, restart.

    `start`, `stop` and `status` are letsinfer's own supervisor (a detached
    `letsinfer up`, no systemd needed; where systemd runs, use the unit the
    Ansible node role installs). `restart` works with either and keeps the
    node's engines serving."""


@scoped(service_group, "init", scope="all")
@click.option("--name", help="This node's name (default: the host name).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def init(ctx: CliContext, name: str | None, as_json: bool) -> None:
    """Make a fresh home the main node without starting it; prints the first API key once.

    A home that already belongs to a node is left as it is (exit 0). Use it
    before handing the node to systemd, whose journal should never hold a key.
    """
    api_key = None
    identity = ctx.identity
    if identity is None:
        settings = config.load(ctx.home.config_file)
        from letsinfer.authority.bootstrap import init_main  # only on a fresh home

        identity, api_key = init_main(ctx.home, settings, name=name)
    info = {
        "initialised": api_key is not None,
        "node_id": identity.node_id,
        "name": identity.name,
        "role": identity.role,
        "api_key": api_key,
    }
    if as_json:
        click.echo(json.dumps(info))
        return
    if api_key is None:
        console.print(f"already a {identity.role} node ({identity.name}); nothing changed")
        return
    console.print(f"main node [bold]{identity.name}[/bold] ({identity.node_id}) initialised")
    click.echo(f"API key   {api_key}")
    click.echo("          (shown once: keep it; more with `letsinfer auth key create`)")


@scoped(service_group, "start", scope="all")
@click.option(
    "--host", metavar="ADDRESS", help="Gateway listen address (default from config: 0.0.0.0)."
)
@click.option("--port", type=int, metavar="PORT", help="Gateway port (default from config: 8000).")
@click.option("--name", help="This node's name when it is initialised (default: host name).")
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
    help="Seconds to wait for the gateway and its models (a main) or the agent port "
    "(a candidate or child).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def start(
    ctx: CliContext,
    host: str | None,
    port: int | None,
    name: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Start this node detached; on a fresh home, first make it the main node.

    Prints the API key once when it initialises the main. Starting a node that
    already runs changes nothing.
    """
    overrides: dict[str, dict[str, object]] = {"gateway": {}}
    up_args: list[str] = []
    if host is not None:
        overrides["gateway"]["host"] = host
        up_args += ["--host", host]
    if port is not None:
        overrides["gateway"]["port"] = port
        up_args += ["--port", str(port)]
    settings = config.load(ctx.home.config_file, overrides=overrides)
    before = service.status(ctx.home)
    api_key = None
    identity = ctx.identity
    if identity is None and not before.running:
        from letsinfer.authority.bootstrap import init_main  # only on a fresh home

        identity, api_key = init_main(ctx.home, settings, name=name)
    # A main answers on its gateway; a candidate or child runs only its agent.
    is_main = identity is None or identity.role == "main"
    begun = time.monotonic()
    try:
        state = service.start(
            ctx.home,
            up_args,
            gateway=(settings.gateway.host, settings.gateway.port) if is_main else None,
            agent=None if is_main else (settings.agent.api_host, settings.agent.api_port),
            home_option=_home_option(),
            timeout=timeout,
        )
    except service.ServiceError as exc:
        _raise(exc)
        return
    shown = "127.0.0.1" if settings.gateway.host in ("0.0.0.0", "") else settings.gateway.host
    # A main just started answers at once, and serves once its engines are
    # ready: the endpoint printed below then answers its first request.
    waited = 0 if before.running else max(0.0, timeout - (time.monotonic() - begun))
    serving = is_main and service.wait_serving(shown, settings.gateway.port, waited)
    info: dict[str, Any] = {
        "started": not before.running,
        "initialised": api_key is not None,
        "running": state.running,
        "pid": state.pid,
        "role": identity.role if identity else None,
        "endpoint": f"http://{shown}:{settings.gateway.port}/v1" if is_main else None,
        "serving": serving,
        "log": str(state.log),
        "api_key": api_key,
    }
    if as_json:
        click.echo(json.dumps(info))
        return
    if not info["started"]:
        console.print(f"already running (pid {state.pid})")
        return
    where = f"endpoint {info['endpoint']}" if is_main else f"agent on :{settings.agent.api_port}"
    console.print(f"started (pid {state.pid}); {where}; log {state.log}")
    if is_main and not serving:
        console.print(
            f"its models are not all ready after {timeout:g}s: `letsinfer status` shows why"
        )
    if api_key:
        click.echo(f"API key   {api_key}")
        click.echo("          (shown once: keep it; more with `letsinfer auth key create`)")


@scoped(service_group, "stop", scope="all")
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
    help="Seconds to wait after SIGTERM (requests in flight finish first) before SIGKILL.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def stop(ctx: CliContext, timeout: float, as_json: bool) -> None:
    """Stop this node and its engines; stopping a stopped node changes nothing."""
    try:
        was_running = service.stop(ctx.home, timeout)
    except service.ServiceError as exc:
        _raise(exc)
        return
    if as_json:
        click.echo(json.dumps({"stopped": was_running, "running": False}))
        return
    console.print("stopped" if was_running else "not running")


@scoped(service_group, "status", scope="all")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def service_status(ctx: CliContext, as_json: bool) -> None:
    """Whether this node runs (exit 0) or not (exit 3), and its log file."""
    state = service.status(ctx.home)
    if as_json:
        click.echo(json.dumps({"running": state.running, "pid": state.pid, "log": str(state.log)}))
    else:
        console.print(f"running (pid {state.pid})" if state.running else "not running")
    if not state.running:
        raise SystemExit(3)


@scoped(service_group, "restart", scope="all")
@click.option(
    "--unit",
    metavar="NAME",
    help="Restart through this systemd unit (default: the unit found running the node, if any).",
)
@click.option(
    "--stop-timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
    help="Seconds the old process has to finish requests in flight before SIGKILL.",
)  # fmt: skip
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
    help="Seconds to wait for the new process to answer.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def restart(
    ctx: CliContext, unit: str | None, stop_timeout: float, timeout: float, as_json: bool
) -> None:
    """Restart this node's letsinfer process; its engines keep serving.

    The running process lets requests in flight finish, leaves its ready
    engines running and exits; the new one (this installation's letsinfer, so
    this is how an upgrade takes effect) adopts every engine it proves is its
    own. A node that is not running is started.
    """
    identity = ctx.identity
    if identity is None:
        raise click.ClickException(
            f"no letsinfer node in {ctx.home.label}: start one with `letsinfer service start`"
        )
    settings = config.load(ctx.home.config_file)
    is_main = identity.role == "main"
    try:
        done = service.restart(
            ctx.home,
            gateway=(settings.gateway.host, settings.gateway.port) if is_main else None,
            agent=None if is_main else (settings.agent.api_host, settings.agent.api_port),
            home_option=_home_option(),
            unit=unit,
            stop_timeout=stop_timeout,
            timeout=timeout,
        )
    except service.ServiceError as exc:
        _raise(exc)
        return
    info = {
        "restarted": done.old_pid is not None,
        "old_pid": done.old_pid,
        "pid": done.state.pid,
        "via": done.via,
        "engines_kept": done.engines,
        "engines_replaced": done.replaced,
        "log": str(done.state.log),
    }
    if as_json:
        click.echo(json.dumps(info))
        return
    if done.old_pid is None:
        console.print(f"was not running; started (pid {done.state.pid}); log {done.state.log}")
        return
    replaced = f", {done.replaced} replaced" if done.replaced else ""
    console.print(
        f"restarted (pid {done.old_pid} -> {done.state.pid}, {done.via}); "
        f"{done.engines} engine(s) kept serving{replaced}; log {done.state.log}",
        soft_wrap=True,
    )
