"""The express lane (letsinfer.gateway.express): the common request answered
from callbacks must end as the handler would end it, whatever the engine or
the client does meanwhile."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from benchmarks.mock_upstream import MockBehaviour, MockUpstream
from letsinfer.gateway.direct import DirectCycle
from letsinfer.gateway.engine_client import CallbackResponse, EngineClient, EngineError
from letsinfer.gateway.express import Express
from letsinfer.store.requests import RequestStore
from tests.gateway_harness import MODEL, GatewayHarness, chat


@pytest.fixture
def express_takes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The request ids the express lane took."""
    taken: list[str] = []
    take = Express.take

    def counted(self: Express, cycle: DirectCycle) -> bool:
        if took := take(self, cycle):
            headers = dict(cycle.scope["headers"])
            taken.append(headers.get(b"x-request-id", b"-").decode())
        return took

    monkeypatch.setattr(Express, "take", counted)
    return taken


def _post(
    h: GatewayHarness, client: httpx.Client, request_id: str, **body: object
) -> httpx.Response:
    return client.post(
        h.url + "/v1/chat/completions",
        json=chat(**body),  # type: ignore[arg-type]
        headers={**h.auth(), "x-request-id": request_id},
    )


def _hold(h: GatewayHarness, pg: str) -> None:
    """From now on the engine takes requests and answers none."""
    h.in_loop(lambda: setattr(h.mocks[pg], "gate", asyncio.Event()))


def _errors(h: GatewayHarness, reason: str) -> float:
    line = f'letsinfer_gateway_errors_total{{reason="{reason}"}} '
    for row in generate_latest(h.gateway.metrics.registry).decode().splitlines():
        if row.startswith(line):
            return float(row.removeprefix(line))
    return 0.0


def test_a_503_in_the_express_lane_goes_to_another_replica_and_never_back(
    tmp_path: Path, express_takes: list[str]
) -> None:
    engines = {"pg-a": MockBehaviour(tokens=3), "pg-b": MockBehaviour(tokens=3)}
    with GatewayHarness(tmp_path, engines) as h, httpx.Client() as client:
        assert _post(h, client, "warm").status_code == 200  # leaves a kept engine connection
        first = next(pg for pg, m in h.mocks.items() if m.stats.requests == 1)
        other = next(pg for pg in engines if pg != first)
        h.mocks[first].behaviour.fault = "unavailable"

        r = _post(h, client, "busy")
        assert r.status_code == 200 and "tok " in r.text
        assert express_takes == ["busy"]
        # Sent once to the 503 (by the lane), then by the handler elsewhere only.
        assert h.mocks[first].stats.requests == 2
        assert h.mocks[other].stats.request_ids[-1] == "busy"
        assert _errors(h, "upstream_retry") == 1
        h.wait_until(lambda: [h.replica(pg).in_flight for pg in engines] == [0, 0])
        assert h.in_loop(lambda: h.gateway.admission.key_in_flight("alice")) == 0


def test_a_dropped_kept_connection_is_retried_fresh_then_elsewhere(
    tmp_path: Path, express_takes: list[str]
) -> None:
    engines = {"pg-a": MockBehaviour(tokens=3), "pg-b": MockBehaviour(tokens=3)}
    with GatewayHarness(tmp_path, engines) as h, httpx.Client() as client:
        assert _post(h, client, "warm").status_code == 200
        first = next(pg for pg, m in h.mocks.items() if m.stats.requests == 1)
        h.mocks[first].behaviour.fault = "drop"

        r = _post(h, client, "dropped")
        assert r.status_code == 200 and "tok " in r.text
        assert express_takes == ["dropped"]
        # The lane's kept connection, then a fresh one (the engine might have
        # closed only an idle connection), then another replica.
        assert h.mocks[first].stats.requests == 3
        h.wait_until(lambda: [h.replica(pg).in_flight for pg in engines] == [0, 0])


def test_an_engine_gone_quiet_in_the_express_lane_is_a_504_and_frees_its_slot(
    tmp_path: Path, express_takes: list[str]
) -> None:
    with (
        GatewayHarness(
            tmp_path, {"pg-a": MockBehaviour(tokens=3)}, upstream_timeout_s=0.5, records=True
        ) as h,
        httpx.Client() as client,
    ):
        assert _post(h, client, "warm").status_code == 200
        _hold(h, "pg-a")
        r = _post(h, client, "quiet")
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "upstream_timeout"
        assert r.headers["x-request-id"] == "quiet"
        assert express_takes == ["quiet"]
        stats = h.mocks["pg-a"].stats
        h.wait_until(lambda: stats.client_gone == 1)  # its connection was closed
        h.wait_until(lambda: h.replica("pg-a").in_flight == 0)
        h.in_loop(lambda: h.mocks["pg-a"].gate.set())  # type: ignore[union-attr]
        assert _post(h, client, "after").status_code == 200
    (row,) = RequestStore(tmp_path / "requests.db").find("quiet")
    assert row.status == 504 and row.pg == "pg-a"


def test_a_request_on_a_long_kept_connection_still_gets_its_whole_read_timeout(
    tmp_path: Path, express_takes: list[str]
) -> None:
    """One read-timeout check runs per engine connection: armed by its first
    request, it must find a later request's deadline further off, not time
    it out by the first one's clock."""
    engine = MockBehaviour(tokens=4)
    with (
        GatewayHarness(tmp_path, {"pg-a": engine}, upstream_timeout_s=4.0) as h,
        httpx.Client() as client,
    ):
        assert _post(h, client, "warm").status_code == 200  # arms the check
        time.sleep(2.8)
        # 2 s of silence: past the first request's deadline, 2 s short of its own
        engine.interval_s = 0.5
        r = _post(h, client, "late")
        assert r.status_code == 200, r.text
        assert express_takes == ["late"]


def test_a_client_leaving_the_express_lane_frees_the_engine_and_is_booked(
    tmp_path: Path, express_takes: list[str]
) -> None:
    with (
        GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=3)}, records=True) as h,
        httpx.Client() as client,
    ):
        assert _post(h, client, "warm").status_code == 200
        _hold(h, "pg-a")
        body = json.dumps(chat()).encode()
        with socket.create_connection(("127.0.0.1", h.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
                b"authorization: Bearer %s\r\nx-request-id: leaver\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (h.keys["alice"].encode(), len(body), body)
            )
            stats = h.mocks["pg-a"].stats
            h.wait_until(lambda: stats.in_flight == 1)
        h.wait_until(lambda: stats.client_gone == 1)  # the engine saw it go
        h.wait_until(lambda: h.replica("pg-a").in_flight == 0)
        assert express_takes == ["leaver"]
        assert _errors(h, "client_disconnected") == 1
    (row,) = RequestStore(tmp_path / "requests.db").find("leaver")
    assert row.status == 499 and row.key == "alice" and row.model == MODEL


def test_a_key_at_its_concurrency_limit_is_refused_while_its_request_is_in_the_lane(
    tmp_path: Path, express_takes: list[str]
) -> None:
    with (
        GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=3)}, keys={"one": 1}) as h,
        httpx.Client() as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        url, auth = h.url + "/v1/chat/completions", {"authorization": f"Bearer {h.keys['one']}"}
        assert client.post(url, json=chat(), headers=auth).status_code == 200
        _hold(h, "pg-a")
        held = pool.submit(
            httpx.post, url, json=chat(), headers={**auth, "x-request-id": "held"}, timeout=10
        )
        h.wait_until(lambda: h.mocks["pg-a"].stats.in_flight == 1)
        r = client.post(url, json=chat(), headers={**auth, "x-request-id": "second"})
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "concurrency_limit_exceeded"
        h.in_loop(lambda: h.mocks["pg-a"].gate.set())  # type: ignore[union-attr]
        assert held.result(10).status_code == 200
        assert express_takes == ["held"]
        h.wait_until(lambda: h.gateway.admission.key_in_flight("one") == 0)


def test_a_stream_breaking_midway_in_the_lane_ends_with_an_error_event(
    tmp_path: Path, express_takes: list[str]
) -> None:
    engines = {"pg-a": MockBehaviour(tokens=6), "pg-b": MockBehaviour(tokens=6)}
    with GatewayHarness(tmp_path, engines, records=True) as h, httpx.Client() as client:
        assert _post(h, client, "warm").status_code == 200
        first = next(pg for pg, m in h.mocks.items() if m.stats.requests == 1)
        other = next(pg for pg in engines if pg != first)
        h.mocks[first].behaviour.fault = "break"  # after two events
        r = client.post(
            h.url + "/v1/chat/completions",
            json=chat(stream=True),
            headers={**h.auth(), "x-request-id": "broken"},
        )
        assert r.status_code == 200 and express_takes == ["broken"]
        data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert sum('"tok "' in d for d in data) == 2
        assert json.loads(data[-1])["error"]["code"] == "upstream_stream_error"
        assert h.mocks[other].stats.requests == 0, "no retry once bytes reached the client"
        h.wait_until(lambda: h.replica(first).in_flight == 0)
    (row,) = RequestStore(tmp_path / "requests.db").find("broken")
    assert row.status == 502 and row.stream


def test_a_client_leaving_a_stream_in_the_lane_frees_the_engine(
    tmp_path: Path, express_takes: list[str]
) -> None:
    slow = MockBehaviour(tokens=500, interval_s=0.02)
    with GatewayHarness(tmp_path, {"pg-a": slow}, records=True) as h, httpx.Client() as client:
        slow.interval_s = 0  # a quick first answer leaves a kept engine connection
        assert _post(h, client, "warm").status_code == 200
        slow.interval_s = 0.02
        with client.stream(
            "POST",
            h.url + "/v1/chat/completions",
            json=chat(stream=True),
            headers={**h.auth(), "x-request-id": "leaver"},
        ) as r:
            assert r.status_code == 200
            assert next(line for line in r.iter_lines() if line.startswith("data: "))
        stats = h.mocks["pg-a"].stats
        h.wait_until(lambda: stats.client_gone == 1 and stats.in_flight == 0)
        h.wait_until(lambda: h.replica("pg-a").in_flight == 0)
        assert express_takes == ["leaver"]
    (row,) = RequestStore(tmp_path / "requests.db").find("leaver")
    assert row.status == 499 and row.stream and row.ttft_ms is not None


def test_a_slow_reader_holds_the_engine_back_and_still_gets_the_whole_stream(
    tmp_path: Path, express_takes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses: list[int] = []
    pause = CallbackResponse.pause

    def counted(self: CallbackResponse) -> None:
        pauses.append(1)
        pause(self)

    monkeypatch.setattr(CallbackResponse, "pause", counted)
    tokens = 20_000  # about 3 MB of events, sent by the engine at once
    with (
        GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=tokens)}) as h,
        httpx.Client() as client,
    ):
        assert _post(h, client, "warm").status_code == 200
        body = json.dumps(chat(stream=True)).encode()
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(20)
            sock.connect(("127.0.0.1", h.port))
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
                b"authorization: Bearer %s\r\nx-request-id: slow\r\nconnection: close\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (h.keys["alice"].encode(), len(body), body)
            )
            h.wait_until(lambda: bool(pauses))  # the client reads nothing yet
            received = bytearray()
            while chunk := sock.recv(65536):
                received += chunk
        assert express_takes == ["slow"]
        assert received.count(b'"tok "') == tokens
        assert received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        h.wait_until(lambda: h.replica("pg-a").in_flight == 0)


def test_requests_to_a_busy_engine_are_held_to_the_turns_end_and_each_gets_its_answer(
    tmp_path: Path, express_takes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    held: list[bool] = []  # each request sent on a kept connection: held to the turn's end?
    post_on_idle = EngineClient.post_on_idle

    def told(self: EngineClient, *args: Any, **kwargs: Any) -> CallbackResponse | None:
        if (sent := post_on_idle(self, *args, **kwargs)) is not None:
            held.append(kwargs["hold"])
        return sent

    monkeypatch.setattr(EngineClient, "post_on_idle", told)
    with (
        GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=3)}) as h,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        stats = h.mocks["pg-a"].stats

        def post(request_id: str) -> concurrent.futures.Future[httpx.Response]:
            return pool.submit(
                httpx.post,
                h.url + "/v1/chat/completions",
                json=chat(content=f"I am {request_id}."),
                headers={**h.auth(), "x-request-id": request_id},
                timeout=10,
            )

        # Two requests in flight at once leave two kept engine connections.
        _hold(h, "pg-a")
        warm = [post("warm-1"), post("warm-2")]
        h.wait_until(lambda: stats.in_flight == 2)
        h.in_loop(lambda: h.mocks["pg-a"].gate.set())  # type: ignore[union-attr]
        assert [f.result(10).status_code for f in warm] == [200, 200]

        _hold(h, "pg-a")
        first = post("first")  # the engine's only request: written at once
        h.wait_until(lambda: stats.in_flight == 1)
        second = post("second")  # the engine is busy: held to the turn's end
        h.wait_until(lambda: stats.in_flight == 2)  # and it got there
        h.in_loop(lambda: h.mocks["pg-a"].gate.set())  # type: ignore[union-attr]
        answers = {rid: f.result(10) for rid, f in (("first", first), ("second", second))}
    assert express_takes == ["first", "second"]
    assert held == [False, True]
    for request_id, r in answers.items():
        assert r.status_code == 200 and r.headers["x-request-id"] == request_id
        assert "tok " in r.json()["choices"][0]["message"]["content"]
    assert list(stats.request_ids)[-2:] == ["first", "second"]


def test_a_held_request_whose_connection_closes_first_is_never_sent_and_fails_as_unsent() -> None:
    class Listener:
        def __init__(self) -> None:
            self.told: list[object] = []

        def response_started(self, response: CallbackResponse) -> None:
            self.told.append("started")

        def response_body(self, response: CallbackResponse, body: bytes) -> None:
            self.told.append(body)

        def response_ended(self, response: CallbackResponse) -> None:
            self.told.append("ended")

        def response_failed(self, response: CallbackResponse, error: EngineError) -> None:
            self.told.append(error)

    async def scenario() -> tuple[Listener, int]:
        mock = await MockUpstream(MockBehaviour(tokens=2)).start()
        client = EngineClient(connect_timeout_s=5, read_timeout_s=5)
        body = json.dumps(chat()).encode()
        try:
            warm = await client.post(mock.url, "/v1/chat/completions", body)
            while await warm.next_chunk() is not None:
                pass  # read whole: its connection is kept
            listener = Listener()
            engine = client.post_on_idle(
                mock.url, "/v1/chat/completions", body, listener, hold=True
            )
            assert engine is not None
            # The connection is lost (as when the engine closes a kept one)
            # before this turn of the loop ends.
            transport = engine.conn.transport
            assert transport is not None
            transport.abort()
            await asyncio.sleep(0.2)
            return listener, mock.stats.requests
        finally:
            await client.aclose()
            await mock.close()

    listener, requests = asyncio.run(scenario())
    assert requests == 1  # the warm-up only: the held request never left
    (error,) = listener.told
    assert isinstance(error, EngineError) and error.before_response


class _OddEngine:
    """An engine on 127.0.0.1 that answers each request with ``before`` (say a
    103 Early Hints), its own JSON answer, then, every second answer,
    ``after`` (say a response nobody asked for), all in one write; it counts
    its connections."""

    def __init__(self, before: bytes = b"", after: bytes = b"") -> None:
        self.before, self.after = before, after
        self.connections = 0
        self.answered = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.answered += 1
                after = self.after if self.answered % 2 == 0 else b""
                writer.write(self.before + _answer(b'{"answer": %d}' % self.answered) + after)
                await writer.drain()
        writer.close()


def _answer(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


class _Collected:
    """A ResponseListener that keeps what it is told."""

    def __init__(self) -> None:
        self.body = b""
        self.ended = asyncio.get_running_loop().create_future()

    def response_started(self, response: CallbackResponse) -> None:
        pass

    def response_body(self, response: CallbackResponse, body: bytes) -> None:
        self.body += body

    def response_ended(self, response: CallbackResponse) -> None:
        self.ended.set_result(response.status)

    def response_failed(self, response: CallbackResponse, error: EngineError) -> None:
        self.ended.set_exception(error)


async def _ask_both_ways(engine: _OddEngine) -> list[bytes]:
    """Four requests in turn, on kept connections where there are: through the
    handler's path (post) and the express lane's (post_on_idle)."""
    client = EngineClient(connect_timeout_s=5, read_timeout_s=5)
    url = await engine.start()
    answers = []
    try:
        for _ in range(2):
            response = await client.post(url, "/v1/chat/completions", b"{}")
            answers.append(await response.read())
            assert response.status == 200
            listener = _Collected()
            lane = client.post_on_idle(url, "/v1/chat/completions", b"{}", listener)
            if lane is None:  # no kept connection: as the lane, the handler connects
                response = await client.post(url, "/v1/chat/completions", b"{}")
                answers.append(await response.read())
            else:
                assert await listener.ended == 200
                answers.append(listener.body)
    finally:
        await client.aclose()
        engine.server.close()
    return answers


def test_an_interim_103_is_passed_over_and_the_connection_kept() -> None:
    engine = _OddEngine(before=b"HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n\r\n")
    answers = asyncio.run(_ask_both_ways(engine))
    assert answers == [b'{"answer": %d}' % n for n in (1, 2, 3, 4)]
    assert engine.connections == 1


def test_a_response_nobody_asked_for_never_reaches_a_later_request() -> None:
    # An engine (or a provider) that sends a second response after an answer
    # (here the express lane's, every second one): kept, that connection would
    # give the next request (maybe another key's) an answer that is not its
    # own. It is closed instead, and the answer itself is whole.
    async def scenario(engine: _OddEngine) -> tuple[bytes, list[bytes]]:
        client = EngineClient(connect_timeout_s=5, read_timeout_s=5)
        url = await engine.start()
        try:
            warm = await client.post(url, "/v1/chat/completions", b"{}")
            await warm.read()  # answer 1: its connection kept
            listener = _Collected()
            lane = client.post_on_idle(url, "/v1/chat/completions", b"{}", listener)
            assert lane is not None
            assert await listener.ended == 200  # answer 2, and the one nobody asked for

            async def one() -> bytes:
                response = await client.post(url, "/v1/chat/completions", b"{}")
                return await response.read()

            # Two requests at once: each on a connection of its own.
            return listener.body, sorted(await asyncio.gather(one(), one()))
        finally:
            await client.aclose()
            engine.server.close()

    engine = _OddEngine(after=_answer(b'{"answer": "not yours"}'))
    lane_answer, answers = asyncio.run(scenario(engine))
    assert lane_answer == b'{"answer": 2}'
    assert answers == [b'{"answer": 3}', b'{"answer": 4}']
    assert engine.connections == 3  # the first closed after what it sent
