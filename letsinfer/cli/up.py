"""``letsinfer up``: bring this home's node up in the foreground."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import sys
from typing import IO

import click

from letsinfer import config
from letsinfer.authority import retirement
from letsinfer.authority.anchor import open_authority
from letsinfer.authority.bootstrap import init_main
from letsinfer.cli import cli
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.identity import load_identity


def _lock_pid_file(ctx: CliContext) -> IO[str]:
    ctx.home.run.mkdir(parents=True, exist_ok=True)
    fh = ctx.home.pid_file.open("a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        raise click.ClickException(
            f"a node is already running from {ctx.home.etc.parent} (pid {fh.read().strip()})"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    return fh  # held open (and locked) for the life of the process


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from exc


def _endpoint(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}/v1"


@scoped(cli, "up", scope="all")
@click.option("--host", help="Gateway listen address (default 0.0.0.0: the LAN).")
@click.option("--port", type=int, help="Gateway port (default 8000).")
@click.option(
    "--engine",
    type=click.Choice(["xllamacpp", "llama-server"]),
    help="Engine for new models: the bundled llama.cpp (xllamacpp) or a llama-server binary.",
)
@click.option(
    "--llama-server",
    "llama_server",
    metavar="PATH",
    help="Path of the llama-server binary (implies --engine llama-server).",
)
@click.option("--name", help="This node's name (default: the host name).")
@click.pass_obj
def up(
    ctx: CliContext,
    host: str | None,
    port: int | None,
    engine: str | None,
    llama_server: str | None,
    name: str | None,
) -> None:
    """Start this node in the foreground; Ctrl-C stops it and its engines.

    On a fresh home this makes it the main node: the authority, a first API key
    (shown once) and the embedded default model.
    """
    overrides: dict[str, dict[str, object]] = {"gateway": {}, "engine": {}}
    if host is not None:
        overrides["gateway"]["host"] = host
    if port is not None:
        overrides["gateway"]["port"] = port
    if llama_server is not None:
        overrides["engine"]["llama_server_binary"] = llama_server
        engine = engine or "llama-server"
    if engine is not None:
        overrides["engine"]["kind"] = engine
    settings = config.load(ctx.home.config_file, overrides=overrides)
    gw = settings.gateway
    lock = _lock_pid_file(ctx)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe is noise
    from letsinfer.connections import (
        RESERVED_FDS,
        GuardedServer,
        gateway_limits,
        raise_file_limit,
    )

    file_limit = raise_file_limit()  # connections are capped below it
    from letsinfer.authority.modelstore import clean_partials

    for leftover in clean_partials(ctx.home.model_store):
        logging.getLogger("letsinfer.node").warning(
            "removed %s: a model import killed midway left it", leftover
        )
    if retirement.complete(ctx.home) is not None:  # a former main's move, interrupted
        ctx = CliContext(ctx.home, load_identity(ctx.home.identity_file))
    if ctx.identity is not None and ctx.identity.role != "main":
        try:
            _run_agent(ctx, settings)
        finally:
            lock.close()
        return
    for host, port_ in (
        (gw.host, gw.port),
        (settings.control.host, settings.control.port),
        (settings.agent.api_host, settings.agent.api_port),
    ):
        _check_port_free(host, port_)

    identity = ctx.identity
    first_key = None
    if identity is None:
        identity, first_key = init_main(ctx.home, settings, name=name)
    import uvicorn

    from letsinfer.node import MainNode

    node = MainNode(ctx.home, settings, identity)
    store = open_authority(ctx.home)
    models = ", ".join(s.name for s in store.list_services()) or "none yet"
    store.close()
    click.echo(f"letsinfer main node '{identity.name}' ({identity.node_id})")
    click.echo(f"  home      {ctx.home.etc.parent}")
    click.echo(f"  endpoint  {_endpoint(gw.host, gw.port)}")
    click.echo(f"  models    {models}")
    if first_key:
        click.echo(f"  API key   {first_key}")
        click.echo("            (shown once: keep it; more with `letsinfer auth key create`)")
    click.echo("Ctrl-C stops the node and its engines.")
    sys.stdout.flush()  # the banner must reach a pipe before the server starts
    server = GuardedServer(
        uvicorn.Config(
            node.app(),
            host=gw.host,
            port=gw.port,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=int(gw.drain_timeout_s),
        ),
        gateway_limits(
            gw.max_connections,
            gw.max_connections_per_client,
            gw.header_timeout_s,
            gw.idle_timeout_s,
            file_limit,
            # the control plane holds a connection per node
            reserved=RESERVED_FDS + node.control_limits().max_connections,
        ),
        name="gateway",
    )
    node.server = server
    try:
        server.run()
        if node.moved:  # `node accept` made this main a child of another cluster
            retirement.complete(ctx.home)
            click.echo("the former authority is retired; starting as a child")
            _run_agent(ctx, settings)
    finally:
        lock.close()


def _run_agent(ctx: CliContext, settings: config.Settings) -> None:
    """A candidate or child: the agent plane until stopped; rebuilt after enrollment."""
    from letsinfer.agent.runtime import AgentNode
    from letsinfer.planes import tls_server

    agent = settings.agent
    _check_port_free(agent.api_host, agent.api_port)
    while True:
        node = AgentNode(ctx.home, settings)
        ident = node.identity
        click.echo(f"letsinfer {ident.role} node '{ident.name}' ({ident.node_id})")
        click.echo(f"  agent     https://{agent.api_host}:{agent.api_port}")
        click.echo(f"  cert      sha256:{node.fingerprint}")
        if ident.role == "candidate":
            click.echo("  waiting for enrollment: `letsinfer node requests` shows offers")
        else:
            click.echo(f"  main      {ident.main_address}")
        click.echo("Ctrl-C stops the node.")
        sys.stdout.flush()

        server = tls_server(
            node.app(),
            agent.api_host,
            agent.api_port,
            node.ssl_context(),
            embedded=False,
            lifespan="on",
            on_refused=node.denials.tls_refusals("agent"),
            name="agent plane",
        )
        node.server = server
        server.run()
        if not node.reload_requested:
            return
