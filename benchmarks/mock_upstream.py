"""A mock OpenAI engine: answers at a fixed pace, counts what it sees, fails on purpose.

The gateway's test double (like httpx's MockTransport) and the upstream of the
gateway benchmark, where it must cost little so the gateway is what is
measured: it is a bare asyncio HTTP/1.1 server on httptools, not a framework.

It serves ``POST /v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings``: a streamed answer is ``tokens`` SSE events ``interval_s``
apart, then ``data: [DONE]`` (with a usage event first when
``stream_options.include_usage`` is set); a plain answer is one JSON body
with usage, after the same total time. It counts requests in flight (its
"slots"), the most it ever had at once, and the requests whose client went
away. Faults for tests: ``drop`` closes the connection before any response,
``unavailable`` answers 503, ``break_after`` cuts a stream after that many
events.

Run alone (the benchmark does), from the checkout: ``python -m benchmarks.mock_upstream
--port 9000 --tokens 16 --interval-ms 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
from dataclasses import dataclass, field
from typing import Literal

import httptools

Fault = Literal["none", "drop", "unavailable", "break"]


@dataclass
class MockBehaviour:
    tokens: int = 8
    interval_s: float = 0.0
    fault: Fault = "none"
    break_after: int = 2  # events sent before a "break" fault cuts the stream


@dataclass
class MockStats:
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    completed: int = 0
    client_gone: int = 0  # requests cancelled because the client closed the connection
    request_ids: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=1000)
    )
    authorizations: set[str] = field(default_factory=set)
    traceparents: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=1000)
    )
    bodies: collections.deque[bytes] = field(default_factory=lambda: collections.deque(maxlen=100))


def _chunk(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _Answers:
    """The answer's bytes, built once per behaviour (the mock must be cheap)."""

    def __init__(self, tokens: int) -> None:
        base = {"id": "chatcmpl-mock", "created": 0, "model": "mock"}
        self.chat_event = _chunk(
            {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}],
            }
        )
        self.chat_last = _chunk(
            {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            }
        )
        self.text_event = _chunk(
            {
                **base,
                "object": "text_completion",
                "choices": [{"index": 0, "text": "tok ", "finish_reason": None}],
            }
        )
        self.text_last = _chunk(
            {
                **base,
                "object": "text_completion",
                "choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
            }
        )
        usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}
        self.usage_event = _chunk(
            {**base, "object": "chat.completion.chunk", "choices": [], "usage": usage}
        )
        content = "tok " * tokens
        self.chat_body = json.dumps(
            {
                **base,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        ).encode()
        self.text_body = json.dumps(
            {
                **base,
                "object": "text_completion",
                "choices": [{"index": 0, "text": content, "finish_reason": "stop"}],
                "usage": usage,
            }
        ).encode()
        self.embedding_body = json.dumps(
            {
                "object": "list",
                "model": "mock",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}],
                "usage": {"prompt_tokens": 2, "total_tokens": 2},
            }
        ).encode()


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)
_UNAVAILABLE = b'{"error":{"message":"loading","type":"unavailable_error","param":null,"code":503}}'


def _json_response(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body) + body
    )


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Connection(asyncio.Protocol):
    def __init__(self, mock: MockUpstream) -> None:
        self.mock = mock
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.task: asyncio.Task[None] | None = None
        self.gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, headers, body = self.url, self.headers, b"".join(self.body)
        self.url, self.headers, self.body = b"", {}, []
        self.task = asyncio.get_running_loop().create_task(self.answer(url, headers, body))

    async def answer(self, url: bytes, headers: dict[bytes, bytes], body: bytes) -> None:
        stats, transport = self.mock.stats, self.transport
        assert transport is not None
        stats.requests += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        if b"x-request-id" in headers:
            stats.request_ids.append(headers[b"x-request-id"].decode())
        if b"authorization" in headers:
            stats.authorizations.add(headers[b"authorization"].decode())
        if b"traceparent" in headers:
            stats.traceparents.append(headers[b"traceparent"].decode())
        stats.bodies.append(body)
        try:
            if self.mock.gate is not None:  # held until the test opens it
                await self.mock.gate.wait()
            await self._answer(url, body, transport)
            stats.completed += 1
        except asyncio.CancelledError:
            if not self.gone:
                raise
            stats.client_gone += 1
        finally:
            stats.in_flight -= 1

    async def _answer(self, url: bytes, body: bytes, transport: asyncio.Transport) -> None:
        b = self.mock.behaviour
        answers = self.mock.answers
        if b.fault == "drop":
            transport.abort()
            return
        if b.fault == "unavailable":
            transport.write(_json_response(b"503 Service Unavailable", _UNAVAILABLE))
            return
        path = url.split(b"?", 1)[0]
        if path == b"/v1/embeddings":
            transport.write(_json_response(b"200 OK", answers.embedding_body))
            return
        if path not in (b"/v1/chat/completions", b"/v1/completions"):
            transport.write(_json_response(b"404 Not Found", b'{"error":{"message":"no"}}'))
            return
        try:
            request = json.loads(body)
        except ValueError:
            transport.write(_json_response(b"400 Bad Request", b'{"error":{"message":"json"}}'))
            return
        chat = path == b"/v1/chat/completions"
        if not request.get("stream"):
            if b.interval_s:
                await asyncio.sleep(b.interval_s * b.tokens)
            transport.write(
                _json_response(b"200 OK", answers.chat_body if chat else answers.text_body)
            )
            return
        event = _chunked(answers.chat_event if chat else answers.text_event)
        transport.write(_STREAM_HEAD)
        for i in range(b.tokens):
            if b.fault == "break" and i == b.break_after:
                transport.abort()
                return
            if i and b.interval_s:
                await asyncio.sleep(b.interval_s)
            transport.write(event)
        tail = [answers.chat_last if chat else answers.text_last]
        if (request.get("stream_options") or {}).get("include_usage"):
            tail.append(answers.usage_event)
        tail.append(b"data: [DONE]\n\n")
        transport.write(b"".join(_chunked(t) for t in tail) + b"0\r\n\r\n")


class MockUpstream:
    """Serve the mock on 127.0.0.1 (port 0 picks a free one) in the running loop."""

    def __init__(self, behaviour: MockBehaviour | None = None, port: int = 0) -> None:
        self.behaviour = behaviour or MockBehaviour()
        self.answers = _Answers(self.behaviour.tokens)
        self.stats = MockStats()
        # Tests: while set and not open, every request waits here (after it is counted).
        self.gate: asyncio.Event | None = None
        self._port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> MockUpstream:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), "127.0.0.1", self._port, backlog=4096
        )
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


async def _serve(args: argparse.Namespace) -> None:
    behaviour = MockBehaviour(tokens=args.tokens, interval_s=args.interval_ms / 1000)
    mock = await MockUpstream(behaviour, port=args.port).start()
    print(f"mock upstream on {mock.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await mock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--interval-ms", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(_serve(args))
    except ImportError:
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
