"""Running the mutual-TLS planes (control, agent) inside a node process.

The gateway's uvicorn server owns the process signals; these embedded servers
run beside it on the same event loop and stop when the node stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Generator
from typing import Any

import uvicorn

from letsinfer.trust.handshake import TlsListener, listening_socket
from letsinfer.trust.peer import PeerCertProtocol

log = logging.getLogger(__name__)


class EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the node's primary server handles SIGINT/SIGTERM


class TlsServer(uvicorn.Server):
    """uvicorn with our own listener: each TLS handshake runs in
    trust/handshake.py so ``on_refused(address, reason)`` hears of
    certificates the cluster CA does not accept."""

    def __init__(
        self,
        config: uvicorn.Config,
        ctx: ssl.SSLContext,
        on_refused: Callable[[str, str], None] | None,
    ) -> None:
        super().__init__(config)
        self.ctx = ctx
        self.on_refused = on_refused
        self.listener: TlsListener | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config = self.config
        sock = listening_socket(config.host, config.port)  # fails before any startup work
        try:
            await super().startup(sockets=[])  # lifespan only: uvicorn listens on nothing
        except BaseException:
            sock.close()
            raise
        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=loop,
            )

        self.listener = TlsListener(sock, self.ctx, protocol, self.on_refused)
        self.listener.start()
        log.info("listening on https://%s:%d (mutual TLS)", config.host, config.port)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.listener is not None:
            await self.listener.close()
        await super().shutdown(sockets=sockets)


class EmbeddedTlsServer(TlsServer, EmbeddedServer):
    pass


def tls_server(
    app: Any,
    host: str,
    port: int,
    ctx: ssl.SSLContext,
    embedded: bool = True,
    lifespan: str = "off",
    on_refused: Callable[[str, str], None] | None = None,
) -> uvicorn.Server:
    """A mutual-TLS plane (control, agent)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=PeerCertProtocol,
        lifespan=lifespan,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server_class = EmbeddedTlsServer if embedded else TlsServer
    return server_class(config, ctx, on_refused)


class RunningPlane:
    def __init__(self, server: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        self.server = server
        self.sockets = sockets  # already listening (the admin socket); else the config's
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.server.serve(sockets=self.sockets))
        while not self.server.started:
            if self.task.done():
                self.task.result()  # raises what stopped it
                raise RuntimeError("plane stopped during startup")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(Exception, SystemExit):
                await self.task
