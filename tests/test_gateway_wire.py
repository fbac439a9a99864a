"""HTTP/1.1 as a client speaks it to the gateway, byte for byte: the inference
POSTs' own path (letsinfer.gateway.direct) and the requests it hands to
uvicorn's ASGI path instead must answer alike."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.mock_upstream import MockBehaviour
from letsinfer.gateway.direct import DirectCycle
from letsinfer.gateway.express import Express
from letsinfer.store.requests import RequestRecord, RequestStore
from tests.gateway_harness import GatewayHarness, chat


def _request(
    h: GatewayHarness, body: bytes, target: str = "/v1/chat/completions", **extra: str
) -> bytes:
    headers = {
        "host": "gateway",
        "authorization": f"Bearer {h.keys['alice']}",
        "content-type": "application/json",
        "content-length": str(len(body)),
        **extra,
    }
    version = headers.pop("version", "HTTP/1.1")
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"POST {target} {version}\r\n{head}\r\n".encode() + body


def _read_response(sock: socket.socket, buffered: bytearray) -> tuple[str, dict[str, str], bytes]:
    """One response from ``sock`` (what follows it stays in ``buffered``)."""

    def fill() -> None:
        data = sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        buffered.extend(data)

    while b"\r\n\r\n" not in buffered:
        fill()
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    buffered[:] = rest
    status, *lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        assert name.lower() not in headers, f"{name} sent twice"
        headers[name.lower()] = value.strip()
    if "content-length" in headers:
        size = int(headers["content-length"])
        while len(buffered) < size:
            fill()
        body = bytes(buffered[:size])
        del buffered[:size]
        return status, headers, body
    assert headers.get("transfer-encoding") == "chunked", headers
    body = b""
    while True:
        while b"\r\n" not in buffered:
            fill()
        size_line, _, _ = bytes(buffered).partition(b"\r\n")
        size = int(size_line, 16)
        while len(buffered) < len(size_line) + 2 + size + 2:
            fill()
        start = len(size_line) + 2
        body += bytes(buffered[start : start + size])
        assert buffered[start + size : start + size + 2] == b"\r\n"
        del buffered[: start + size + 2]
        if size == 0:
            return status, headers, body


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayHarness]:
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=3)}) as h:
        yield h


def _connect(h: GatewayHarness) -> socket.socket:
    return socket.create_connection(("127.0.0.1", h.port), timeout=10)


@pytest.fixture
def direct_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests the direct path answered (its handler or its
    express lane)."""
    taken: list[str] = []
    run, take = DirectCycle.run_asgi, Express.take

    async def counted(self: DirectCycle, app: object = None) -> None:
        taken.append(self.scope["path"])
        await run(self, app)

    def counted_express(self: Express, cycle: DirectCycle) -> bool:
        if took := take(self, cycle):
            taken.append(cycle.scope["path"])
        return took

    monkeypatch.setattr(DirectCycle, "run_asgi", counted)
    monkeypatch.setattr(Express, "take", counted_express)
    return taken


@pytest.mark.parametrize(
    ("target", "extra", "direct"),
    [
        ("/v1/chat/completions", {}, True),
        ("/v1/chat/completions?x=1", {}, False),  # a query string: ASGI's
        ("/v1/chat/%63ompletions", {}, False),  # percent-encoded: ASGI's
        ("/v1/chat/completions", {"expect": "100-continue"}, False),
    ],
)
def test_plain_and_streamed_answers_are_framed_alike_on_either_path(
    gateway: GatewayHarness,
    direct_requests: list[str],
    target: str,
    extra: dict[str, str],
    direct: bool,
) -> None:
    h = gateway
    with _connect(h) as sock:
        buffered = bytearray()
        for stream in (False, True, False):  # one kept-alive connection throughout
            sock.sendall(_request(h, json.dumps(chat(stream)).encode(), target, **extra))
            if "expect" in extra:
                while b"\r\n\r\n" not in buffered:
                    buffered.extend(sock.recv(65536))
                assert bytes(buffered).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
                del buffered[: len(b"HTTP/1.1 100 Continue\r\n\r\n")]
            status, headers, body = _read_response(sock, buffered)
            assert status == "HTTP/1.1 200 OK"
            assert "date" in headers and headers["x-request-id"]
            if stream:
                assert headers["content-type"].startswith("text/event-stream")
                assert headers["cache-control"] == "no-cache"
                assert body.count(b'"tok "') == 3 and body.endswith(b"data: [DONE]\n\n")
                assert b'"usage"' not in body  # asked for on the client's behalf, taken out
            else:
                assert json.loads(body)["choices"][0]["message"]["content"] == "tok " * 3
        assert not buffered
    assert direct_requests == (["/v1/chat/completions"] * 3 if direct else [])


def test_pipelined_requests_are_answered_in_order(gateway: GatewayHarness) -> None:
    h = gateway
    requests = [
        _request(h, json.dumps(chat(stream)).encode(), **{"x-request-id": f"pipe-{n}"})
        for n, stream in enumerate((False, True, False, True))
    ]
    with _connect(h) as sock:
        sock.sendall(b"".join(requests))  # all at once, before any answer
        buffered = bytearray()
        ids = []
        for _ in requests:
            status, headers, _ = _read_response(sock, buffered)
            assert status == "HTTP/1.1 200 OK"
            ids.append(headers["x-request-id"])
    assert ids == ["pipe-0", "pipe-1", "pipe-2", "pipe-3"]


@pytest.mark.parametrize(
    "extra", [{"connection": "close"}, {"version": "HTTP/1.0"}], ids=["close", "http1.0"]
)
def test_a_client_that_asks_for_close_gets_its_answer_then_the_close(
    gateway: GatewayHarness, extra: dict[str, str]
) -> None:
    h = gateway
    with _connect(h) as sock:
        sock.sendall(_request(h, json.dumps(chat()).encode(), **extra))
        status, headers, body = _read_response(sock, bytearray())
        assert status.endswith("200 OK") and headers["connection"] == "close"
        assert json.loads(body)["object"] == "chat.completion"
        assert _closed(sock)


def test_a_refusal_on_the_direct_path_keeps_the_connection_usable(
    gateway: GatewayHarness,
) -> None:
    h = gateway
    with _connect(h) as sock:
        buffered = bytearray()
        sock.sendall(_request(h, b"{not json"))
        status, _, body = _read_response(sock, buffered)
        assert status == "HTTP/1.1 400 Bad Request"
        assert json.loads(body)["error"]["type"] == "invalid_request_error"
        sock.sendall(_request(h, json.dumps(chat()).encode()))
        status, _, _ = _read_response(sock, buffered)
        assert status == "HTTP/1.1 200 OK"


def test_a_body_sent_in_pieces_is_read_whole(gateway: GatewayHarness) -> None:
    h = gateway
    body = json.dumps(chat()).encode()
    raw = _request(h, body)
    with _connect(h) as sock:
        head_end = raw.index(b"\r\n\r\n") + 4
        sock.sendall(raw[:head_end])  # headers first: the handler starts, then waits
        for i in range(0, len(body), 7):
            sock.sendall(body[i : i + 7])
        status, _, answer = _read_response(sock, bytearray())
        assert status == "HTTP/1.1 200 OK", answer
    sent = json.loads(h.mocks["pg-a"].stats.bodies[-1])
    assert sent["messages"] == chat()["messages"]


def test_a_body_larger_than_the_read_buffer_arrives_whole(gateway: GatewayHarness) -> None:
    # Past 64 KiB the connection stops reading until the handler takes what it has.
    h = gateway
    content = "".join(f"{n:07d} " for n in range(40_000))  # 320 kB
    body = json.dumps(chat(content=content)).encode()
    with _connect(h) as sock:
        sock.sendall(_request(h, body))
        status, _, answer = _read_response(sock, bytearray())
        assert status == "HTTP/1.1 200 OK", answer
    sent = json.loads(h.mocks["pg-a"].stats.bodies[-1])
    assert sent["messages"][0]["content"] == content


def test_a_client_leaving_midway_through_its_body_reaches_no_engine(
    gateway: GatewayHarness,
) -> None:
    h = gateway
    raw = _request(h, json.dumps(chat()).encode())
    with _connect(h) as sock:
        sock.sendall(raw[: len(raw) - 10])  # the body's last bytes never come
    with _connect(h) as sock:  # the gateway goes on serving
        sock.sendall(raw)
        status, _, _ = _read_response(sock, bytearray())
        assert status == "HTTP/1.1 200 OK"
    assert h.mocks["pg-a"].stats.requests == 1


def _untimed(record: RequestRecord) -> RequestRecord:
    return record._replace(ts=0, ttft_ms=0, duration_ms=0, queue_ms=0)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_the_express_lane_answers_and_books_a_request_as_the_handler_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """The same request twice on one connection: the handler answers the first,
    the express lane the second."""
    taken: list[bool] = []
    take = Express.take

    def first_to_the_handler(self: Express, cycle: DirectCycle) -> bool:
        taken.append(took := bool(taken) and take(self, cycle))
        return took

    monkeypatch.setattr(Express, "take", first_to_the_handler)
    answers = []
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=3)}, records=True) as h:
        request = _request(h, json.dumps(chat(stream)).encode(), **{"x-request-id": "twice"})
        with _connect(h) as sock:
            buffered = bytearray()
            for _ in range(2):
                sock.sendall(request)
                status, headers, body = _read_response(sock, buffered)
                del headers["date"]
                answers.append((status, list(headers.items()), body))
    assert taken == [False, True]
    assert answers[0] == answers[1]  # the same headers in the same order, the same body
    status, fields, body = answers[0]
    assert status == "HTTP/1.1 200 OK" and ("x-request-id", "twice") in fields
    assert body.endswith(b"data: [DONE]\n\n") if stream else json.loads(body)["usage"]
    handler, express = RequestStore(tmp_path / "requests.db").find("twice")
    assert _untimed(handler) == _untimed(express)
    assert express.status == 200 and express.pg == "pg-a" and express.completion_tokens == 3
