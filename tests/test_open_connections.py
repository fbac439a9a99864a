"""Open connections are bounded: idle and slow clients are closed in time, a
listener stops accepting at its cap and takes only so many from one source,
and a JSON body too deep for the parser is refused before it is parsed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from letsinfer.connections import ConnectionLimits, GuardedServer, gateway_limits
from letsinfer.jsondepth import too_deep

LIMITS = ConnectionLimits(max_connections=6, per_client=4, header_timeout_s=0.5, idle_timeout_s=0.5)
# For tests whose steps must all happen before a timeout: a stall of this
# process on a loaded machine must not close a connection between two steps.
RELAXED = ConnectionLimits(max_connections=6, per_client=4, header_timeout_s=3, idle_timeout_s=3)
REQUEST = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


class Served:
    """A guarded server on 127.0.0.1 in a thread of its own."""

    def __init__(self, limits: ConnectionLimits, admit: Callable[[str], bool] | None) -> None:
        config = uvicorn.Config(hello, host="127.0.0.1", port=0, lifespan="off", log_config=None)
        self.server = GuardedServer(config, limits, name="test", admit=admit, embedded=True)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        self.task = asyncio.run_coroutine_threadsafe(self.server.serve(), self.loop)
        deadline = time.monotonic() + 10
        while not self.server.port:
            assert time.monotonic() < deadline and not self.task.done(), "server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        try:
            self.task.result(timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)

    @property
    def open(self) -> int:
        assert self.server.listener is not None
        return self.server.listener.open

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        sock = socket.socket()
        sock.bind((source, 0))
        sock.settimeout(5)
        sock.connect(("127.0.0.1", self.server.port))
        return sock


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    params = getattr(request, "param", {})
    with Served(params.get("limits", LIMITS), params.get("admit")) as s:
        yield s


def closed_by_server(sock: socket.socket, within_s: float = 5.0) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def ask(sock: socket.socket) -> bytes:
    sock.sendall(REQUEST)
    data = b""
    while not data.endswith(b"ok"):
        chunk = sock.recv(4096)
        assert chunk, f"closed before the answer: {data!r}"
        data += chunk
    return data


def test_a_client_silent_after_connecting_is_closed(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "letsinfer.connections")
    with served.connect() as silent:
        assert closed_by_server(silent)
    assert "test: closed 1 connection(s) that sent no complete request headers" in caplog.text


def test_slowloris_is_closed_though_bytes_keep_coming(served: Served) -> None:
    with served.connect() as slow:
        slow.settimeout(0.1)
        closed = False
        deadline = time.monotonic() + 10  # twenty header timeouts
        for byte in (REQUEST[:-2] + b"X-Pad: " + b"a" * 1000)[:1000]:
            try:
                slow.send(bytes([byte]))
                if slow.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass  # nothing from the server yet: keep trickling
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            assert time.monotonic() < deadline, "a header byte now and then kept it open"
        assert closed


@pytest.mark.parametrize("served", [{"limits": RELAXED}], indirect=True)
def test_kept_alive_connections_serve_then_close_when_idle_or_slow(served: Served) -> None:
    with served.connect() as kept:
        for _ in range(3):  # whole requests: never cut, however many
            assert b"200 OK" in ask(kept)
        assert closed_by_server(kept, within_s=10)  # then idle: closed after the idle timeout
    with served.connect() as slow:
        assert b"200 OK" in ask(slow)
        slow.sendall(REQUEST[:10])  # the next request's headers never finish
        assert closed_by_server(slow, within_s=10)


@pytest.mark.parametrize("served", [{"limits": RELAXED}], indirect=True)
def test_at_its_cap_a_listener_stops_accepting_until_connections_close(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "letsinfer.connections")
    cap = RELAXED.max_connections
    sources = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    idle = [served.connect(sources[i % 3]) for i in range(cap)]
    try:
        waiting = served.connect("127.0.0.5")  # queued by the kernel, not accepted
        waiting.sendall(REQUEST)
        deadline = time.monotonic() + 10
        while "test: at its cap of 6 open connections" not in caplog.text:
            assert served.open <= cap
            assert time.monotonic() < deadline, "the listener never reached its cap"
            time.sleep(0.01)
        # Header timeouts free the slots; the waiting client is then served.
        waiting.settimeout(20)
        assert waiting.recv(4096).startswith(b"HTTP/1.1 200")
        waiting.close()
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize("served", [{"limits": RELAXED}], indirect=True)
def test_one_source_gets_at_most_its_share(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "letsinfer.connections")
    mine = [served.connect("127.0.0.2") for _ in range(RELAXED.per_client)]
    try:
        with served.connect("127.0.0.2") as one_more:
            assert closed_by_server(one_more, within_s=2)
        assert "from a source already holding 4 (last: 127.0.0.2)" in caplog.text
        with served.connect("127.0.0.3") as other:
            assert b"200 OK" in ask(other)
    finally:
        for sock in mine:
            sock.close()


@pytest.mark.parametrize("served", [{"limits": RELAXED}], indirect=True)
def test_headers_past_their_cap_are_refused_but_an_early_answer_s_body_is_not_headers(
    served: Served,
) -> None:
    """A client that never ends its headers gets 431 once they pass 128 KiB
    (not whatever it sends within the header timeout: 3 s here, in which
    loopback carries all 4 MiB); a large body the server answered before
    reading it (a 401 does) is not taken for headers."""
    with served.connect() as endless:
        endless.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: ")
        answer, sent = b"", 0
        try:
            while sent < 4 << 20:
                endless.sendall(b"a" * 16384)
                sent += 16384
        except OSError:
            pass
        with contextlib.suppress(OSError):
            answer = endless.recv(4096)
        assert sent < 4 << 20 or answer.startswith(b"HTTP/1.1 431"), (sent, answer[:80])
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:80]
    with served.connect() as big:
        big.sendall(b"POST / HTTP/1.1\r\nHost: t\r\ncontent-length: 1048576\r\n\r\n")
        first = b""
        while not first.endswith(b"ok"):  # answered before its body is read
            first += big.recv(4096)
        assert b"200 OK" in first
        for _ in range(16):
            big.sendall(b"x" * 65536)
        assert b"200 OK" in ask(big)  # the same connection, after the unread body


@pytest.mark.parametrize(
    "served", [{"admit": lambda address: address != "127.0.0.2"}], indirect=True
)
def test_a_source_not_admitted_is_closed_as_accepted(served: Served) -> None:
    with served.connect("127.0.0.2") as refused:
        refused.sendall(REQUEST)
        assert closed_by_server(refused, within_s=2)
    assert httpx.get(f"http://127.0.0.1:{served.server.port}/").text == "ok"


def test_the_gateway_cap_stays_below_the_file_limit(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="letsinfer.connections"):
        limits = gateway_limits(10_000, 1_000, 10, 5, file_limit=4096)
    # said plainly: what it takes, what it was asked, why, and what allows more
    assert (
        "gateway: takes at most 1536 connections at once, not max_connections = 10000: "
        "this process may open only 4096 files" in caplog.text
    )
    assert "LimitNOFILE" in caplog.text
    # each client connection may hold an engine connection too; 1024 kept aside
    assert limits.max_connections == (4096 - 1024) // 2
    assert gateway_limits(10_000, 1_000, 10, 5, file_limit=1 << 20).max_connections == 10_000
    small = gateway_limits(10_000, 1_000, 10, 5, file_limit=1024)
    assert small.max_connections == 256 and small.per_client == 256


def test_json_depth_is_measured_without_parsing() -> None:
    def nested(depth: int) -> bytes:
        return b'{"a": ' * depth + b"1" + b"}" * depth

    assert not too_deep(nested(64)) and too_deep(nested(65))
    assert too_deep(b"[" * 100_000)  # unclosed: the parser would recurse just the same
    # brackets inside strings (escaped quotes included) are text
    text = json.dumps({"model": "m", "prompt": '[{"\\' * 500 + '\\"}'}).encode()
    assert not too_deep(text)
    flat = json.dumps({"messages": [{"role": "user", "content": "x"}] * 500}).encode()
    assert not too_deep(flat)
