"""The gateway in front of mock engines, used as a client would use it."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import httpx
import openai
import pytest

from benchmarks.mock_upstream import MockBehaviour
from letsinfer.config import GatewaySettings
from letsinfer.gateway.metrics import start_metrics_server
from letsinfer.gateway.routing import Replica
from tests.gateway_harness import MODEL, GatewayHarness, chat
from tests.nodes import free_port
from tests.test_engine_load import running_engine

SLOW = MockBehaviour(tokens=6, interval_s=0.02)


def events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def test_answers_stream_and_plain_with_request_id_usage_and_access_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="letsinfer.access")
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=5)}) as h:
        url = h.url + "/v1/chat/completions"
        plain = httpx.post(url, json=chat(), headers={**h.auth(), "x-request-id": "req-1"})
        assert plain.status_code == 200, plain.text
        assert plain.headers["x-request-id"] == "req-1"
        assert plain.json()["choices"][0]["message"]["content"] == "tok " * 5

        streamed = httpx.post(
            url,
            json=chat(stream=True, stream_options={"include_usage": True}),
            headers={**h.auth("bob"), "x-request-id": "req-2"},
        )
        assert streamed.status_code == 200
        assert streamed.headers["content-type"].startswith("text/event-stream")
        data = events(streamed.text)
        assert data[-1] == "[DONE]"
        assert sum('"tok "' in d for d in data) == 5

        # The id reached the engine, and the engine got its own key, not the client's.
        assert list(h.mocks["pg-a"].stats.request_ids) == ["req-1", "req-2"]
        assert h.mocks["pg-a"].stats.authorizations == {"Bearer engine-key-pg-a"}

        # An alias works, and the official client streams through the gateway.
        client = openai.OpenAI(base_url=h.url + "/v1", api_key=h.keys["alice"], max_retries=0)
        pieces = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="mock-alias", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            if c.choices
        ]
        assert "".join(pieces) == "tok " * 5

    lines = [r.getMessage() for r in caplog.records if r.name == "letsinfer.access"]
    first = next(line for line in lines if "request_id=req-1" in line)
    assert "key=alice model=mock served=mock pg=pg-a status=200" in first
    assert "completion_tokens=5" in first and "ttft_ms=" in first and "queue_ms=" in first
    second = next(line for line in lines if "request_id=req-2" in line)
    assert "key=bob" in second and "completion_tokens=5" in second


def test_capacity_is_never_exceeded_and_waiting_requests_all_finish(tmp_path: Path) -> None:
    engines = {"pg-a": SLOW, "pg-b": SLOW}
    with GatewayHarness(tmp_path, engines, capacity=2) as h:

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as client:

                async def one(i: int) -> int:
                    key = "alice" if i % 3 else "bob"
                    r = await client.post(
                        h.url + "/v1/chat/completions",
                        json=chat(stream=bool(i % 2)),
                        headers=h.auth(key),
                    )
                    return r.status_code

                return await asyncio.gather(*(one(i) for i in range(16)))

        statuses = asyncio.run(burst())
        assert statuses == [200] * 16
        for pg in engines:
            assert h.mocks[pg].stats.max_in_flight <= 2, pg
        h.wait_until(lambda: sum(m.stats.completed for m in h.mocks.values()) == 16)
        assert h.in_loop(lambda: h.gateway.admission.depth()) == 0
        # Slots come back just after the last byte went out.
        h.wait_until(lambda: [h.replica(pg).in_flight for pg in engines] == [0, 0])


def test_an_engine_failing_before_answering_is_retried_on_another(tmp_path: Path) -> None:
    engines = {
        "pg-drop": MockBehaviour(fault="drop"),
        "pg-busy": MockBehaviour(fault="unavailable"),
        "pg-good": MockBehaviour(tokens=3),
    }
    with GatewayHarness(tmp_path, engines) as h:
        for stream in (False, True):
            r = httpx.post(h.url + "/v1/chat/completions", json=chat(stream), headers=h.auth())
            assert r.status_code == 200, r.text
            assert "tok " in r.text and "error" not in r.text
        # Both broken engines were tried (equal load: the first published goes first).
        assert h.mocks["pg-drop"].stats.requests == 2
        assert h.mocks["pg-busy"].stats.requests == 2
        h.wait_until(lambda: h.mocks["pg-good"].stats.completed == 2)
        h.wait_until(lambda: [h.replica(pg).in_flight for pg in engines] == [0, 0, 0])


def test_when_every_engine_fails_before_answering_the_client_gets_503(tmp_path: Path) -> None:
    engines = {"pg-a": MockBehaviour(fault="drop"), "pg-b": MockBehaviour(fault="drop")}
    with GatewayHarness(tmp_path, engines) as h:
        r = httpx.post(h.url + "/v1/chat/completions", json=chat(), headers=h.auth())
        assert r.status_code == 503
        assert r.headers["retry-after"]
        message = r.json()["error"]["message"]
        assert "pg-a" in message and "pg-b" in message


def test_a_stream_breaking_midway_ends_with_an_error_event_and_no_retry(tmp_path: Path) -> None:
    engines = {
        "pg-break": MockBehaviour(tokens=6, fault="break", break_after=2),
        "pg-good": MockBehaviour(tokens=6),
    }
    with GatewayHarness(tmp_path, engines) as h:
        r = httpx.post(h.url + "/v1/chat/completions", json=chat(True), headers=h.auth())
        assert r.status_code == 200
        data = events(r.text)
        assert sum('"tok "' in d for d in data) == 2
        error = json.loads(data[-1])["error"]
        assert error["code"] == "upstream_stream_error" and "stream broke" in error["message"]
        assert h.mocks["pg-good"].stats.requests == 0, "no retry once bytes reached the client"

        # The official client raises on it rather than ending quietly.
        client = openai.OpenAI(base_url=h.url + "/v1", api_key=h.keys["alice"], max_retries=0)
        with pytest.raises(openai.APIError):
            for _ in client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True
            ):
                pass


def test_a_client_leaving_mid_stream_frees_the_engine_slot(tmp_path: Path) -> None:
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=500, interval_s=0.02)}) as h:
        with httpx.stream(
            "POST", h.url + "/v1/chat/completions", json=chat(True), headers=h.auth()
        ) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            assert h.mocks["pg-a"].stats.in_flight == 1
        # The response is closed after one event: the engine must see it go.
        stats = h.mocks["pg-a"].stats
        h.wait_until(lambda: stats.in_flight == 0)
        assert stats.client_gone == 1 and stats.completed == 0
        h.wait_until(lambda: h.replica("pg-a").in_flight == 0)


def test_a_client_leaving_while_queued_leaves_the_queue(tmp_path: Path) -> None:
    with GatewayHarness(
        tmp_path, {"pg-a": MockBehaviour(tokens=500, interval_s=0.02)}, capacity=1
    ) as h:
        url = h.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=chat(True), headers=h.auth()) as holder:
            assert holder.status_code == 200
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json=chat(), headers=h.auth("bob"), timeout=0.3)
            h.wait_until(lambda: h.gateway.admission.depth() == 0)
        h.wait_until(lambda: h.replica("pg-a").in_flight == 0)
        assert h.mocks["pg-a"].stats.requests == 1


def test_a_full_queue_answers_429_with_retry_after(tmp_path: Path) -> None:
    with GatewayHarness(
        tmp_path,
        {"pg-a": MockBehaviour(tokens=500, interval_s=0.02)},
        capacity=1,
        queue_max_waiting=1,
    ) as h:
        url = h.url + "/v1/chat/completions"
        embed = {"model": MODEL, "input": "x"}  # quick once it gets the slot

        async def scenario() -> tuple[httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                async with client.stream("POST", url, json=chat(True), headers=h.auth()) as held:
                    assert held.status_code == 200
                    waiting = asyncio.create_task(
                        client.post(h.url + "/v1/embeddings", json=embed, headers=h.auth("bob"))
                    )
                    while h.gateway.admission.depth() < 1:  # an int read across threads
                        await asyncio.sleep(0.01)
                    refused = await client.post(url, json=chat(), headers=h.auth("bob"))
                # The held stream closed: the waiting request gets its slot.
                return refused, await waiting

        refused, served = asyncio.run(scenario())
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "queue_full" and "at capacity" in error["message"]
        assert served.status_code == 200


def test_waiting_past_the_limit_answers_429(tmp_path: Path) -> None:
    with GatewayHarness(
        tmp_path,
        {"pg-a": MockBehaviour(tokens=500, interval_s=0.02)},
        capacity=1,
        queue_max_wait_s=0.2,
    ) as h:
        url = h.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=chat(True), headers=h.auth()) as held:
            assert held.status_code == 200
            r = httpx.post(url, json=chat(), headers=h.auth("bob"))
        assert r.status_code == 429 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "queue_timeout"


def test_a_key_over_its_concurrency_gets_429_and_others_are_unaffected(tmp_path: Path) -> None:
    with GatewayHarness(
        tmp_path,
        {"pg-a": MockBehaviour(tokens=500, interval_s=0.02)},
        keys={"limited": 1, "free": None},
    ) as h:
        url = h.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=chat(True), headers=h.auth("limited")) as held:
            assert held.status_code == 200
            r = httpx.post(url, json=chat(), headers=h.auth("limited"))
            assert r.status_code == 429 and r.headers["retry-after"]
            error = r.json()["error"]
            assert error["code"] == "concurrency_limit_exceeded"
            assert "'limited'" in error["message"] and "1 request" in error["message"]
            with pytest.raises(openai.RateLimitError):
                openai.OpenAI(
                    base_url=h.url + "/v1", api_key=h.keys["limited"], max_retries=0
                ).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
            embed = {"model": MODEL, "input": "x"}  # a quick request
            other = httpx.post(h.url + "/v1/embeddings", json=embed, headers=h.auth("free"))
            assert other.status_code == 200
        # The slot comes back when the held stream ends.
        h.wait_until(lambda: h.gateway.admission.key_in_flight("limited") == 0)
        again = httpx.post(h.url + "/v1/embeddings", json=embed, headers=h.auth("limited"))
        assert again.status_code == 200


def test_no_healthy_replica_is_503_and_a_paused_one_gets_nothing(tmp_path: Path) -> None:
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour(), "pg-b": MockBehaviour()}) as h:
        url = h.url + "/v1/chat/completions"
        h.in_loop(lambda: h.routing.set_paused(MODEL, "pg-a", True))
        for _ in range(3):
            assert httpx.post(url, json=chat(), headers=h.auth()).status_code == 200
        assert h.mocks["pg-a"].stats.requests == 0 and h.mocks["pg-b"].stats.requests == 3
        h.in_loop(lambda: h.routing.withdraw(MODEL, "pg-b", "engine exited"))
        r = httpx.post(url, json=chat(), headers=h.auth())
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "no_healthy_replica"


def test_bad_requests_get_openai_shaped_errors_and_reach_no_engine(tmp_path: Path) -> None:
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour()}, max_body_bytes=2048) as h:
        url = h.url + "/v1/chat/completions"
        cases = [
            (httpx.post(url, json=chat()), 401, "invalid_api_key"),
            (httpx.post(url, json=chat(), headers={"authorization": "Bearer li-x"}), 401, None),
            (httpx.post(url, content=b"{nope", headers=h.auth()), 400, None),
            (httpx.post(url, json={**chat(), "model": "gpt-9"}, headers=h.auth()), 404, None),
            (httpx.post(url, json=chat(content="x" * 4096), headers=h.auth()), 413, None),
            (httpx.get(url, headers=h.auth()), 405, None),
        ]
        for response, status, code in cases:
            assert response.status_code == status, response.text
            error = response.json()["error"]
            assert error["message"] and error["type"]
            if code:
                assert error["code"] == code
        assert h.mocks["pg-a"].stats.requests == 0


def test_hinted_chats_pass_over_an_engine_whose_facts_say_hot_and_full(tmp_path: Path) -> None:
    """Most chats carry a prefix-affinity hint (a system prompt long enough):
    the facts still decide which engines may take them."""
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour(), "pg-b": MockBehaviour()}) as h:
        now = h.routing.clock()
        h.publish("pg-a", temperature_c=99.0, queue_depth=40, slots_free=0, facts_at=now)
        h.publish("pg-b", temperature_c=50.0, slots_free=4, facts_at=now)
        with httpx.Client(timeout=30) as c:
            for i in range(40):
                prompt = f"Conversation {i}. You are a helpful assistant; answer briefly."
                body = chat(content=prompt)
                assert (
                    c.post(h.url + "/v1/chat/completions", json=body, headers=h.auth()).status_code
                    == 200
                )
        assert h.mocks["pg-a"].stats.requests == 0
        assert h.mocks["pg-b"].stats.requests == 40


def test_image_or_audio_for_a_text_only_model_is_the_clients_error_before_any_engine(
    tmp_path: Path,
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    text = {"type": "text", "text": "What is in it?"}
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour()}) as h, httpx.Client() as c:
        url = h.url + "/v1/chat/completions"
        for part, kind in ((image, "image"), (audio, "audio")):
            for stream in (False, True):
                body = {
                    **chat(stream=stream),
                    "messages": [{"role": "user", "content": [text, part]}],
                }
                r = c.post(url, json=body, headers=h.auth())
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert error["type"] == "invalid_request_error"
                assert error["code"] == "unsupported_content" and error["param"] == "messages"
                assert f"reads text only: it cannot take {kind} input" in error["message"]
        assert h.mocks["pg-a"].stats.requests == 0
        # Text given as parts is text.
        body = {**chat(), "messages": [{"role": "user", "content": [text]}]}
        assert c.post(url, json=body, headers=h.auth()).status_code == 200
        # A client's model name is echoed bounded.
        r = c.post(url, json={**chat(), "model": "m" * 100_000}, headers=h.auth())
        assert r.status_code == 404 and len(r.content) < 1000, len(r.content)
        assert "'" + "m" * 128 + "...'" in r.json()["error"]["message"]
        r = c.get(h.url + "/v1/models/" + "m" * 50_000, headers=h.auth())
        assert r.status_code == 404 and len(r.content) < 1000, len(r.content)


def test_an_engine_refusal_comes_back_openai_shaped_as_the_clients_error(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    """The real tiny llama.cpp engine refuses a chat longer than its context:
    the client gets OpenAI's shape and code, not the engine's own."""
    with (
        running_engine(tiny_gguf, "engine-key", parallel=1, n_ctx=512) as engine_url,
        GatewayHarness(tmp_path, {}) as h,
        httpx.Client(timeout=60) as c,
    ):
        real = Replica("pg-real", MODEL, engine_url, "Bearer engine-key", capacity=1)
        h.in_loop(lambda: h.routing.publish(real))
        url = h.url + "/v1/chat/completions"
        many = {**chat(), "messages": [{"role": "user", "content": "hello there"}] * 100}
        # The first through the handler; the engine then closes its connection,
        # so a good answer leaves one idle for the express lane to take the
        # second; the third (streamed) through the handler again.
        for stream in (False, None, False, True):
            if stream is None:
                assert c.post(url, json=chat(), headers=h.auth()).status_code == 200
                continue
            r = c.post(url, json={**many, "stream": stream}, headers=h.auth())
            assert r.status_code == 400, r.text
            assert r.headers["content-type"].startswith("application/json")
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, error
            assert error["type"] == "invalid_request_error"
            assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
            assert "reads at most 512 tokens" in error["message"], error


def test_a_flood_of_bad_keys_writes_a_bounded_number_of_access_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from letsinfer.gateway import access_log

    caplog.set_level(logging.INFO, logger="letsinfer.access")
    monkeypatch.setattr(access_log, "_clock", lambda: 7.0)  # all within one second
    monkeypatch.setattr(access_log, "_window", [0.0, 0, 0])  # none left out before
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=2)}) as h, httpx.Client() as c:
        bad = {"authorization": "Bearer li-not-a-key"}
        for _ in range(100):
            assert (
                c.post(h.url + "/v1/chat/completions", json=chat(), headers=bad).status_code == 401
            )
        assert (
            c.post(h.url + "/v1/chat/completions", json=chat(), headers=h.auth()).status_code == 200
        )
        monkeypatch.setattr(access_log, "_clock", lambda: 8.0)
        assert c.post(h.url + "/v1/chat/completions", json=chat(), headers=bad).status_code == 401
        h.wait_until(lambda: "refusals_not_logged" in caplog.text)
    lines = [r.getMessage() for r in caplog.records if r.name == "letsinfer.access"]
    refused = [line for line in lines if "status=401" in line]
    assert len(refused) == access_log.MAX_REFUSAL_LINES_PER_S + 1
    assert refused[-1].endswith("refusals_not_logged=80")
    assert sum("status=200" in line for line in lines) == 1  # a served request: always


def test_metrics_are_served_on_their_own_port(tmp_path: Path) -> None:
    port = free_port()
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=2)}) as h:
        settings = GatewaySettings(metrics_port=port)
        server = h.call(start_metrics_server(h.gateway.metrics, settings))
        assert server is not None
        try:
            for stream in (False, True):
                httpx.post(h.url + "/v1/chat/completions", json=chat(stream), headers=h.auth())
            httpx.post(h.url + "/v1/chat/completions", json=chat())  # no key: an error
            done = 'letsinfer_gateway_requests_total{model="-",status="401"} 1.0'
            text = ""
            for _ in range(200):  # the count lands just after the last byte went out
                text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
                if done in text:
                    break
                time.sleep(0.01)
        finally:
            h.call(server.stop())
    assert 'letsinfer_gateway_requests_total{model="mock",status="200"} 2.0' in text
    assert 'letsinfer_gateway_errors_total{reason="invalid_api_key"} 1.0' in text
    assert 'letsinfer_gateway_in_flight{model="mock",pg="pg-a"} 0.0' in text
    assert 'letsinfer_gateway_queue_depth{model="mock"} 0.0' in text
    assert "letsinfer_gateway_time_to_first_token_seconds_bucket" in text
    assert "letsinfer_gateway_request_duration_seconds_count" in text
