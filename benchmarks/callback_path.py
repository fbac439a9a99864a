"""An experiment, not the product: letsinfer's own per-request work driven from
protocol callbacks, as the floor forwards (``benchmarks/python_floor.py``).

The zero-delay benchmark shows the floor keeping up with nginx and letsinfer
at about 0.4x not streaming, so the gap is letsinfer's work per request. This
server does that work with the gateway's real code (``authenticate``, the
request's parse and checks, the allowlist, the prefix hash, the admission's
replica choice and release, the usage count, the metrics, the request record
and the access-log line, each booked once per turn of the loop as the gateway
books them) but with no task, future or timer per request: each request runs
from the connection's callbacks, as a state machine would. Its figure says
what a callback-driven request path could reach; the gap between it and
letsinfer is what the coroutine design costs.

What it leaves out, so its figure is an upper bound: answers only plain
(non-streaming) requests, and only when a replica has a free slot; forwards
the engine's status line and headers as they are (the gateway writes its
own); no timeouts, retries, fallback, queueing, disconnect handling, limits,
cache or tracing; errors answer 404 with the exception's text.

``python -m benchmarks.callback_path`` takes the arguments of
``benchmarks.letsinfer_gateway`` and sets up the same way (the benchmark starts
it with the letsinfer row's: records, facts, breadth).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from urllib.parse import urlsplit

import httptools
import uvloop

from benchmarks.letsinfer_gateway import arguments, set_up
from benchmarks.python_floor import _Proxy, _Upstream
from letsinfer.gateway import access_log, policy, protocol
from letsinfer.gateway.directory import ServiceEntry
from letsinfer.gateway.exchange import request_id_from, usage_tokens
from letsinfer.gateway.gateway import Gateway
from letsinfer.gateway.routing import Replica
from letsinfer.gateway.serving import ENDPOINTS, ROUTES, authenticate
from letsinfer.heap import settle_after_startup
from letsinfer.store.requests import RequestRecord


class _Engine(_Upstream):
    """A kept engine connection: the answer goes to the client as it arrives and
    its body is kept for the usage count."""

    def __init__(self, idle: list[_Upstream]) -> None:
        super().__init__(idle)
        self.parts: list[bytes] = []

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        request = self.client
        super().on_message_complete()  # free for the next request
        body, self.parts = b"".join(self.parts), []
        if isinstance(request, _Request):
            request.path.answered(request, body, self.parser.get_status_code())


class _Engines(_Proxy):
    """One engine's kept connections, as the floor keeps its upstream's."""

    connection = _Engine


class _Request(asyncio.Protocol):
    """A client's connection; on it, one request at a time."""

    def __init__(self, path: _CallbackPath) -> None:
        self.path = path
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.auth: bytes | None = None
        self.given_id: bytes | None = None
        self.parts: list[bytes] = []
        # What the request came to, booked after the answer.
        self.started = self.arrived = self.total_s = 0.0
        self.key = self.request_id = self.endpoint = ""
        self.entry: ServiceEntry | None = None
        self.replica: Replica | None = None
        self.status = 0
        self.answer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def on_message_begin(self) -> None:
        self.url, self.auth, self.given_id, self.parts = b"", None, None, []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"authorization":
            self.auth = value
        elif name == b"x-request-id":
            self.given_id = value

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        try:
            self.path.start(self)
        except Exception as exc:  # the experiment's only error answer
            text = repr(exc).encode()
            if self.transport is not None:
                self.transport.write(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: %d\r\n\r\n%s" % (len(text), text)
                )


class _CallbackPath:
    def __init__(self, gw: Gateway, prefix_chars: int) -> None:
        self.gw = gw
        self.prefix_chars = prefix_chars
        self.engines: dict[str, _Engines] = {}  # by base URL
        self.finished: list[_Request] = []

    def start(self, request: _Request) -> None:
        gw = self.gw
        request.started, request.arrived = time.perf_counter(), time.time()
        path = request.url.decode()
        if path == "/health" and request.transport is not None:  # the benchmark's probe
            request.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return
        key = authenticate(gw, request.auth.decode("latin-1") if request.auth else None)
        body = b"".join(request.parts)
        route = ROUTES[path]
        parsed = protocol.parse(body, route)
        entry = gw.directory.current().names.get(parsed["model"])
        if entry is None or not key.allows(entry.name) or parsed.get("stream", False):
            raise LookupError("unknown model, not allowed, or a stream")
        hint = None
        if self.prefix_chars:
            start = protocol.prompt_start(parsed, route.kind, self.prefix_chars)
            hint = policy.prefix_hash(start, gw.policy)
        replica = gw.admission._pick(entry.serves, hint, frozenset())
        if replica is None:
            raise LookupError("every replica is full")
        request.key, request.entry, request.replica = key.name, entry, replica
        request.endpoint = ENDPOINTS[path]
        request.request_id = request_id_from(request.given_id)
        head = (
            f"POST {path} HTTP/1.1\r\nhost: engine\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nx-request-id: {request.request_id}\r\n\r\n"
        ).encode()
        engine = self.engines.get(replica.base_url)
        if engine is None:
            target = urlsplit(replica.base_url)
            engine = _Engines(target.hostname or "127.0.0.1", target.port or 80)
            self.engines[replica.base_url] = engine
        engine.forward(request, head + body)

    def answered(self, request: _Request, body: bytes, status: int) -> None:
        assert request.replica is not None
        self.gw.admission.release(request.replica)
        request.total_s = time.perf_counter() - request.started
        request.status, request.answer = status, body
        self.finished.append(request)
        if len(self.finished) == 1:
            asyncio.get_running_loop().call_soon(self._book)

    def _book(self) -> None:
        finished, self.finished = self.finished, []
        rows = []
        for r in finished:
            assert r.entry is not None and r.replica is not None
            prompt, completion = usage_tokens(r.answer)
            rows.append((r, r.entry.name, r.replica.pg_id, prompt, completion))
        gw = self.gw
        gw.metrics.requests(
            (name, r.status, r.total_s, None, r.key, pg, prompt, completion)
            for r, name, pg, prompt, completion in rows
        )
        if gw.records is not None:
            gw.records.add_many(
                RequestRecord(
                    r.arrived,
                    r.request_id,
                    r.key,
                    name,
                    pg,
                    None,
                    r.endpoint,
                    False,
                    r.status,
                    prompt,
                    completion,
                    None,
                    r.total_s * 1000,
                    0.0,
                    False,
                )
                for r, name, pg, prompt, completion in rows
            )
        access_log.write_many(
            (
                r.request_id,
                r.key,
                name,
                name,
                pg,
                r.status,
                0.0,
                "-",
                r.total_s * 1000,
                prompt,
                completion,
                "",
            )
            for r, name, pg, prompt, completion in rows
        )


async def _serve(args: argparse.Namespace) -> None:
    """Set up exactly as the benchmark's letsinfer row (same arguments, same
    authority, keys, replicas, records and facts), then serve from callbacks."""
    bench = set_up(args)
    background = bench.start_background(args)
    settle_after_startup()
    path = _CallbackPath(bench.gateway, bench.settings.affinity_prefix_chars)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Request(path), "127.0.0.1", args.port, backlog=4096)
    try:
        async with server:
            await server.serve_forever()
    finally:
        for task in background:
            task.cancel()


def main() -> None:
    uvloop.run(_serve(arguments().parse_args()))


if __name__ == "__main__":
    main()
