"""Inference POSTs answered by the gateway's HTTP protocol itself, not over ASGI.

Every completion and embedding request is one of three POSTs whose answers
the gateway builds itself (status, a few headers it wrote, then the engine's
bytes). On that path ASGI's generality costs per request: a scope, an event
and a receive future per request, a task to watch for the client leaving,
and every response header checked again. So the gateway's connections (a
uvicorn httptools protocol, with its parsing, keep-alive, pipelining, flow
control and header deadline kept) hand those three POSTs to
:class:`DirectCycle`, which gives the same handler
(:class:`letsinfer.gateway.serving.InferenceEndpoints`) lean ``receive``,
``send`` and a disconnect watch that costs an attribute:

- the body is usually whole by the time the handler runs, and ``receive``
  returns it without waiting;
- a response's status line and headers leave with its first body part, in
  one write (chunked for a stream, Content-Length otherwise);
- the connection's loss cancels the handler directly.

The handler starts only once the body is whole (or too large to hold): a
request of the common kind is then answered without it, from callbacks, by
the express lane (letsinfer.gateway.express).

Anything else (other methods and paths, HTTP/1.0, ``Expect: 100-continue``,
an absolute or percent-encoded URL) takes uvicorn's ASGI path as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, MutableMapping
from typing import Any

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from letsinfer.gateway.errors import internal_error
from letsinfer.gateway.express import Express
from letsinfer.gateway.serving import ROUTES, InferenceEndpoints

log = logging.getLogger("letsinfer.gateway")

_DISCONNECT: dict[str, Any] = {"type": "http.disconnect"}
_LAST_CHUNK = b"0\r\n\r\n"
# A body held until it is whole, for the express lane: up to uvicorn's high
# water mark, past which it pauses reading until a handler takes the body.
_DEFER_BYTES = HIGH_WATER_LIMIT


class DirectCycle:
    """One inference request on a connection: what uvicorn's protocol expects
    of a request cycle (``body``, ``more_body``, ``message_event.set()``,
    ``disconnected``, ``response_complete``, ``keep_alive``, ``run_asgi``), and
    the ``receive``/``send`` the handler uses."""

    __slots__ = (
        "_gone",
        "_head",
        "_set",
        "_waiter",
        "body",
        "chunked",
        "deferred",
        "disconnected",
        "endpoints",
        "keep_alive",
        "message_event",
        "more_body",
        "protocol",
        "response_complete",
        "resumes",
        "scope",
        "task",
    )

    def __init__(
        self, protocol: Any, endpoints: InferenceEndpoints, scope: MutableMapping[str, Any]
    ) -> None:
        self.protocol = protocol
        self.endpoints = endpoints
        self.scope = scope
        self.body = b""
        self.more_body = True
        self.message_event = self  # uvicorn calls message_event.set()
        self.disconnected = False
        self.response_complete = False
        self.keep_alive = True
        self.chunked = False
        self.deferred = False  # no handler yet: the express lane may take it whole
        self.resumes: Callable[[], None] | None = None  # once the client catches up
        self.task: asyncio.Task[None] | None = None
        self._head: bytes | None = None  # status line and headers, sent with the first part
        self._set = False
        self._waiter: asyncio.Future[None] | None = None
        self._gone: Callable[[], None] | None = None

    # -- what uvicorn's protocol calls ---------------------------------------
    def set(self) -> None:
        """More body, its end, or the connection lost."""
        if self.deferred:
            if self.more_body and not self.disconnected and len(self.body) <= _DEFER_BYTES:
                return  # more to come
            self.deferred = False
            # The body is whole: the express lane answers from callbacks, or
            # the handler does (so does every body too large to hold here,
            # and a client gone before its body was).
            if self.more_body or self.disconnected or not self.protocol.express.take(self):
                self.start()
            return
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.disconnected and self._gone is not None:
            gone, self._gone = self._gone, None
            gone()

    def start(self) -> None:
        """Run the handler in a task of its own, as uvicorn runs a request."""
        protocol = self.protocol
        task = protocol.loop.create_task(self.run_asgi())
        self.task = task
        task.add_done_callback(protocol.tasks.discard)
        protocol.tasks.add(task)

    async def run_asgi(self, app: object = None) -> None:
        """The handler, as uvicorn starts a request (``app`` is not used)."""
        if self.task is None:
            self.task = asyncio.current_task()
        try:
            await self.endpoints.serve(self.scope, self.receive, self.send, self.watch, self.task)
        except asyncio.CancelledError:  # the server's shutdown ran out of time
            self.protocol.transport.close()
            raise
        except Exception:  # (the handler answers its own failures: this is a bug)
            log.exception("request on %s failed unexpectedly", self.scope["path"])
            if self._head is None and not self.response_complete:
                self.keep_alive = False
                await internal_error().send(self.send, "-")
            else:
                self.protocol.transport.close()
        else:
            if not self.response_complete and not self.disconnected:
                self.protocol.transport.close()  # an answer cut short: the client must see it

    # -- what the handler calls ---------------------------------------------
    async def receive(self) -> MutableMapping[str, Any]:
        if self.more_body and not self.body and not self.disconnected:
            self.protocol.flow.resume_reading()
            while not self._set:
                self._waiter = self.protocol.loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            self._set = False
        if self.disconnected or self.response_complete:
            return _DISCONNECT
        body, self.body = self.body, b""
        self._set = False
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    def watch(self, gone: Callable[[], None]) -> Callable[[], None]:
        """Call ``gone`` if the client leaves before its answer is complete;
        returns what stops watching."""
        if self.disconnected:
            gone()
        else:
            self._gone = gone
        return self.unwatch

    def unwatch(self) -> None:
        self._gone = None

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if self.protocol.flow.write_paused and not self.disconnected:
            await self.protocol.flow.drain()
        if self.disconnected or self.response_complete:
            return
        if message["type"] == "http.response.start":
            self.start_response(message["status"], message["headers"])
        else:
            self.write(message.get("body", b""), message.get("more_body", False))

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole answer at once, from a callback (the express lane's)."""
        if not (self.disconnected or self.response_complete):
            self.start_response(status, headers)
            self.write(body, False)

    def start_response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        parts = [STATUS_LINE[status]]
        for name, value in self.protocol.server_state.default_headers:  # date, server
            parts += (name, b": ", value, b"\r\n")
        chunked = True
        # The handler's own headers: names it wrote, values it checked
        # (an engine's content type has passed httptools' parser).
        for name, value in headers:
            if name == b"content-length":
                chunked = False
            parts += (name, b": ", value, b"\r\n")
        if chunked:
            parts.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        self.chunked = chunked
        self._head = b"".join(parts)

    def write(self, body: bytes, more: bool) -> None:
        if self.chunked:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += _LAST_CHUNK
        else:
            data = body
        head = self._head
        if head is not None:
            data = head + data
            self._head = b""  # sent (not None: the response has started)
        protocol = self.protocol
        transport = protocol.transport
        if data:
            transport.write(data)
        if not more:
            self.response_complete = True
            self._gone = None
            if not self.keep_alive:
                transport.close()
            protocol.on_response_complete()


class DirectInference:
    """Mixed in front of uvicorn's httptools protocol (see :func:`protocol_mixin`):
    the inference POSTs go to a :class:`DirectCycle`.

    uvicorn's parser callbacks are replaced where an inference POST does not
    need their work: its ASGI scope, built for every request before its URL
    is known, is built once the headers are (a few keys for an inference
    POST, uvicorn's own for any other request), and its body goes straight to
    the cycle."""

    inference: InferenceEndpoints
    express: Express
    routes: frozenset[bytes]

    # uvicorn's protocol sets these
    parser: Any
    url: bytes
    scope: MutableMapping[str, Any]
    cycle: Any
    expect_100_continue: bool
    limit_concurrency: int | None
    pipeline: Any
    flow: Any
    loop: asyncio.AbstractEventLoop
    tasks: set[asyncio.Task[None]]
    headers: list[tuple[bytes, bytes]]
    client: tuple[str, int] | None
    server: tuple[str, int | None] | None
    scheme: str | None
    root_path: str

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        cycle = self.cycle  # (uvicorn's own cycle, for a request on ASGI's path)
        resumes = getattr(cycle, "resumes", None)
        if resumes is not None:
            cycle.resumes = None
            resumes()

    def on_headers_complete(self) -> None:
        parser = self.parser
        url = self.url
        if (
            url not in self.routes
            or parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or self.expect_100_continue
            or self.limit_concurrency is not None
            or parser.should_upgrade()
        ):
            # uvicorn's own scope, made by its on_message_begin, which also
            # starts the request over: what was parsed so far is put back
            url, headers, expect = self.url, self.headers, self.expect_100_continue
            super().on_message_begin()  # type: ignore[misc]
            self.url, self.expect_100_continue = url, expect
            self.headers.extend(headers)  # the scope's list
            super().on_headers_complete()  # type: ignore[misc]
            return
        path = url.decode("ascii")
        scope = self.scope = {
            "type": "http",
            "http_version": "1.1",
            "method": "POST",
            "scheme": self.scheme,
            "root_path": self.root_path,
            "path": path,
            "raw_path": url,
            "query_string": b"",
            "headers": self.headers,
            "client": self.client,
            "server": self.server,
        }
        cycle = DirectCycle(self, self.inference, scope)
        cycle.keep_alive = parser.should_keep_alive()
        before = self.cycle
        self.cycle = cycle
        if before is None or before.response_complete:
            cycle.deferred = True  # until its body is whole (DirectCycle.set)
        else:  # pipelined behind an unfinished answer: uvicorn starts it after that
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, None))

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is not DirectCycle:
            super().on_body(body)  # type: ignore[misc]
        elif not cycle.response_complete:
            cycle.body += body
            if len(cycle.body) > HIGH_WATER_LIMIT:
                self.flow.pause_reading()
            cycle.set()

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is not DirectCycle:
            super().on_message_complete()  # type: ignore[misc]
        elif not cycle.response_complete:
            cycle.more_body = False
            cycle.set()


def protocol_mixin(endpoints: InferenceEndpoints) -> type:
    """A :class:`DirectInference` bound to the gateway's endpoints, for
    :class:`letsinfer.connections.GuardedServer`'s ``protocol_mixins``."""
    return type(
        "GatewayInference",
        (DirectInference,),
        {
            "inference": endpoints,
            "express": Express(endpoints),
            "routes": frozenset(r.encode() for r in ROUTES),
        },
    )
