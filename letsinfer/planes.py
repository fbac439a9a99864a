"""Running the mutual-TLS planes (control, agent) inside a node process.

The gateway's uvicorn server owns the process signals; these embedded servers
run beside it on the same event loop and stop when the node stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Generator
from typing import Any

import uvicorn

from letsinfer.trust.peer import PeerCertProtocol


class EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the node's primary server handles SIGINT/SIGTERM


def tls_server(
    app: Any,
    host: str,
    port: int,
    ctx: ssl.SSLContext,
    embedded: bool = True,
    lifespan: str = "off",
) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=PeerCertProtocol,
        lifespan=lifespan,
        ssl_context_factory=lambda _config, _default: ctx,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return EmbeddedServer(config) if embedded else uvicorn.Server(config)


class RunningPlane:
    def __init__(self, server: uvicorn.Server) -> None:
        self.server = server
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.server.serve())
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
