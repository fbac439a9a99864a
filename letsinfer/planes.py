"""Running the mutual-TLS planes (control, agent) inside a node process.

The gateway's uvicorn server owns the process signals; these embedded servers
run beside it on the same event loop and stop when the node stops. Their
connections are bounded like the gateway's (letsinfer/connections.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Generator
from typing import Any

import uvicorn

from letsinfer.connections import (
    PLANE_LIMITS,
    ConnectionLimits,
    GuardedServer,
    Listener,
    ProtocolFactory,
)
from letsinfer.trust.handshake import TlsListener
from letsinfer.trust.peer import PeerCertProtocol, Presenting


class EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the node's primary server handles SIGINT/SIGTERM


class TlsServer(GuardedServer):
    """A guarded server whose listener runs each TLS handshake itself
    (trust/handshake.py), so ``on_refused(address, reason)`` hears of
    certificates the cluster CA does not accept."""

    scheme = "https"
    security = "mutual TLS; "

    def __init__(
        self,
        config: uvicorn.Config,
        tls: Presenting,
        on_refused: Callable[[str, str], None] | None,
        limits: ConnectionLimits = PLANE_LIMITS,
        *,
        name: str,
        embedded: bool = True,
    ) -> None:
        super().__init__(config, limits, name=name, embedded=embedded)
        self.tls = tls
        self.on_refused = on_refused

    def make_listener(self, sock: socket.socket, protocol: ProtocolFactory) -> Listener:
        return TlsListener(sock, self.limits, protocol, self.tls, self.on_refused, name=self.name)


def tls_server(
    app: Any,
    host: str,
    port: int,
    tls: Presenting,
    embedded: bool = True,
    lifespan: str = "off",
    on_refused: Callable[[str, str], None] | None = None,
    name: str = "mutual-TLS plane",
    limits: ConnectionLimits = PLANE_LIMITS,
) -> TlsServer:
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
    return TlsServer(config, tls, on_refused, limits, name=name, embedded=embedded)


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
