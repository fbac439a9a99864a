"""The cheapest reverse proxy Python can be on the gateway's own stack: a floor.

It forwards each request's bytes to a kept connection to the upstream and the
answer's bytes back as they arrive, on uvloop with httptools finding where
each message ends: no task, future or timer per request, no key, no JSON, no
bookkeeping. Nothing a gateway must do, so no gateway in Python on this stack
can be cheaper. The zero-delay benchmark measures it beside nginx and
letsinfer: ``floor/nginx`` is the most any Python data path could reach there,
and ``letsinfer/floor`` is what letsinfer's own work costs on top of it.

Not a product: no error handling beyond closing, no pipelining, HTTP/1.1
keep-alive only. ``python -m benchmarks.python_floor --port P --upstream URL``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Protocol
from urllib.parse import urlsplit

import httptools
import uvloop


class _Upstream(asyncio.Protocol):
    """One kept connection to the upstream, carrying one request at a time."""

    def __init__(self, idle: list[_Upstream]) -> None:
        self.idle = idle  # its pool's kept connections, which it joins when free
        self.parser = httptools.HttpResponseParser(self)
        self.client: _Peer | None = None  # whose request it carries
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.client is not None and self.client.transport is not None:
            self.client.transport.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.client = None
        self.idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.idle:
            self.idle.remove(self)
        if self.client is not None and self.client.transport is not None:
            self.client.transport.close()


class _Peer(Protocol):
    transport: asyncio.Transport | None


class _Client(asyncio.Protocol):
    """A client's connection: each whole request goes to an idle upstream connection."""

    def __init__(self, proxy: _Proxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.complete = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.pending.append(data)
        self.parser.feed_data(data)
        if self.complete:
            self.complete = False
            request, self.pending = b"".join(self.pending), []
            self.proxy.forward(self, request)

    def on_message_complete(self) -> None:
        self.complete = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


class _Proxy:
    connection: type[_Upstream] = _Upstream  # what each kept upstream connection is

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: list[_Upstream] = []

    def forward(self, client: _Peer, request: bytes) -> None:
        if self.idle:
            self._send(self.idle.pop(), client, request)
        else:  # a new upstream connection only when every kept one is busy
            asyncio.get_running_loop().create_task(self._connect(client, request))

    async def _connect(self, client: _Peer, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(
            lambda: self.connection(self.idle), self.host, self.port
        )
        self._send(upstream, client, request)

    def _send(self, upstream: _Upstream, client: _Peer, request: bytes) -> None:
        upstream.client = client
        assert upstream.transport is not None
        upstream.transport.write(request)


async def _serve(port: int, upstream: str) -> None:
    target = urlsplit(upstream)
    proxy = _Proxy(target.hostname or "127.0.0.1", target.port or 80)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(proxy), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    args = parser.parse_args()
    uvloop.run(_serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
