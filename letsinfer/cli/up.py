"""``letsinfer up``: bring this home's node up in the foreground."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import stat
import sys
from types import FrameType
from typing import IO, TYPE_CHECKING

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority import retirement
from letsinfer.authority.bootstrap import init_main
from letsinfer.cli import cli
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.identity import load_identity

if TYPE_CHECKING:
    import uvicorn


def _lock_pid_file(ctx: CliContext) -> IO[str]:
    ctx.home.ensure_run()
    fh = ctx.home.pid_file.open("a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        raise click.ClickException(
            f"a node is already running from {ctx.home.label} (pid {fh.read().strip()})"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    return fh  # held open (and locked) for the life of the process


class _Once(logging.Filter):
    """Lets an informational line through the first time only."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def _release_pid_file(ctx: CliContext, fh: IO[str]) -> None:
    """A node that stops leaves no pid file behind (Ctrl-C, SIGTERM, an error).
    Removed while still locked, and only if it is still this process's."""
    try:
        if ctx.home.pid_file.read_text().strip() == str(os.getpid()):
            ctx.home.pid_file.unlink()
    except OSError:
        pass
    finally:
        fh.close()


def _shown_on_screen() -> bool:
    """Whether stdout reaches a person (a terminal, or a pipe such as `| tee`),
    not a file or a journal, where a secret would stay for good."""
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (OSError, ValueError):
        return False
    return sys.stdout.isatty() or stat.S_ISFIFO(mode)


def _show_first_key(ctx: CliContext, key: str) -> None:
    """The first API key, shown once: on screen, or, when the output goes to a
    log (a service's file, the systemd journal), into a 0600 file whose path
    the log names, never the key itself."""
    if _shown_on_screen():
        click.echo(f"  API key   {key}")
        click.echo("            (shown once: keep it; more with `letsinfer auth key create`)")
        return
    path = ctx.home.etc / "first-api-key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    click.echo(f"  API key   in {path} (mode 0600; read it, keep it, then delete the file)")


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
@click.option(
    "--host", metavar="ADDRESS", help="Gateway listen address (default 0.0.0.0, the LAN)."
)
@click.option("--port", type=int, metavar="PORT", help="Gateway port (default 8000).")
@click.option(
    "--engine",
    type=click.Choice(["xllamacpp", "llama-server"]),
    metavar="ENGINE",
    help="Engine for new models: xllamacpp (the bundled llama.cpp) or llama-server.",
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
    and the embedded default model. The key is shown once, on the screen; when
    the output goes to a file or a journal instead, it is written to
    <etc>/first-api-key (mode 0600) and the output says where.
    """
    overrides: dict[str, dict[str, object]] = {"gateway": {}, "engine": {}}
    if host is None:
        from letsinfer.exposure.settings import plain_host

        host = plain_host(ctx.home)  # `exposure enable --plain off`: loopback only
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
    # Ctrl-C stops the node from its first line on: a shell script's
    # background job inherits SIGINT ignored, and the server takes the signal
    # only once it serves, so one sent while it starts would be lost.
    signal.signal(signal.SIGINT, _ctrl_c)
    lock = _lock_pid_file(ctx)
    try:
        _run(ctx, settings, name)
    except KeyboardInterrupt:  # uvicorn raises the Ctrl-C again once it has stopped
        click.echo("letsinfer: stopped (Ctrl-C)")
    finally:
        _release_pid_file(ctx, lock)


class _CtrlC:
    """SIGINT for `up`: the first Ctrl-C stops the node, later ones are ignored.

    Not Python's default_int_handler: under uvicorn's server.run, asyncio.Runner
    swaps that one for its own handler, which cancels the server's task, so a
    Ctrl-C in the instant before uvicorn takes the signal cancelled the node
    half-way through its start (a traceback, the lifespan torn down by the
    interpreter's exit); and a KeyboardInterrupt raised inside the event loop's
    own start-up code breaks the loop. So: before the server runs, a Ctrl-C
    raises KeyboardInterrupt where the node is; once it runs, it only asks the
    server to stop (uvicorn then finishes starting, stops cleanly and returns),
    and _serve turns that into the KeyboardInterrupt that `up` reports."""

    def __init__(self) -> None:
        self.asked = False
        self.server: uvicorn.Server | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.asked:
            return  # already stopping
        self.asked = True
        if self.server is None:
            raise KeyboardInterrupt
        self.server.should_exit = True


_ctrl_c = _CtrlC()


def _serve(server: uvicorn.Server) -> None:
    """server.run(), a Ctrl-C at any moment of it being a stop (KeyboardInterrupt)."""
    _ctrl_c.server = server
    try:
        server.run()
    finally:
        _ctrl_c.server = None
    if _ctrl_c.asked:
        raise KeyboardInterrupt


def _run(ctx: CliContext, settings: config.Settings, name: str | None) -> None:
    """The node, in the foreground, while this process holds the pid file."""
    gw = settings.gateway
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Noise: httpx logs each probe and the gguf writer describes the tiny model
    # it writes; uvicorn says its start and stop lines again for every server
    # the node embeds (letsinfer itself says once what listens where).
    for noisy in ("httpx", "gguf"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("uvicorn.error").addFilter(_Once())
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
        _run_agent(ctx, settings)
        return
    from letsinfer.service import handover, listener

    # A restart: the previous process kept the gateway's socket open for us.
    inherited = listener.take(ctx.home, gw.host, gw.port)
    for host, port_ in (
        *(() if inherited else ((gw.host, gw.port),)),
        (settings.control.host, settings.control.port),
        (settings.agent.api_host, settings.agent.api_port),
    ):
        _check_port_free(host, port_)

    identity = ctx.identity
    first_key = None
    if identity is None:
        identity, first_key = init_main(ctx.home, settings, name=name)
    import uvicorn

    from letsinfer.gateway.app import direct_path
    from letsinfer.node import MainNode

    node = MainNode(ctx.home, settings, identity)
    store = open_authority(ctx.home)
    models = ", ".join(s.name for s in store.list_services()) or "none yet"
    store.close()
    click.echo(f"letsinfer main node '{identity.name}' ({identity.node_id})")
    click.echo(f"  home      {ctx.home.label}")
    click.echo(f"  endpoint  {_endpoint(gw.host, gw.port)}")
    click.echo(f"  models    {models}")
    if first_key:
        _show_first_key(ctx, first_key)
    click.echo("Ctrl-C stops the node and its engines.")
    sys.stdout.flush()  # the banner must reach a pipe before the server starts
    app = node.app()
    server = GuardedServer(
        uvicorn.Config(
            app,
            http="httptools",  # the inference path is built on it (direct_path)
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
        batch_writes=True,
        protocol_mixins=direct_path(app),
        inherited=inherited,
        keep_listener=lambda sock: handover.asked(ctx.home) and listener.hand_over(ctx.home, sock),
    )
    node.server = server
    _serve(server)
    if node.moved:  # `node accept` made this main a child of another cluster
        retirement.complete(ctx.home)
        click.echo("the former authority is retired; starting as a child")
        _run_agent(ctx, settings)


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
        click.echo(f"  cert      sha256:{node.tls.fingerprint}")
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
            node.tls,
            embedded=False,
            lifespan="on",
            on_refused=node.denials.tls_refusals("agent"),
            name="agent plane",
        )
        node.server = server
        _serve(server)
        if not node.reload_requested:
            return
