"""A user's first hour: a main node on one machine, used with the official client."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import openai
import pytest

from letsinfer.engines.tinymodel import SENTENCE
from tests.nodes import start_node

CHAT = [{"role": "user", "content": "Say something."}]


def test_openai_client_end_to_end(tmp_path: Path) -> None:
    node = start_node(tmp_path / "home")
    try:
        assert node.key and node.key.startswith("li-"), node.banner
        assert any(f"http://127.0.0.1:{node.port}/v1" in line for line in node.banner)
        client = node.client()

        assert [m.id for m in client.models.list()] == ["tiny"]

        reply = client.chat.completions.create(model="tiny", messages=CHAT, temperature=1.5)
        assert reply.choices[0].message.content == SENTENCE
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage is not None
        assert reply.usage.completion_tokens > 0 and reply.usage.prompt_tokens > 0
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens

        stream = client.chat.completions.create(
            model="tiny", messages=CHAT, stream=True, stream_options={"include_usage": True}
        )
        pieces, usage = [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        assert len(pieces) > 3, "the answer must arrive as several chunks"
        assert "".join(pieces) == SENTENCE
        assert usage is not None and usage.completion_tokens == reply.usage.completion_tokens

        cut = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3)
        assert cut.choices[0].finish_reason == "length"
        assert SENTENCE.startswith(cut.choices[0].message.content or "-")

        text = client.completions.create(model="tiny", prompt="Once", max_tokens=2)
        assert SENTENCE.startswith(text.choices[0].text)

        emb = client.embeddings.create(model="tiny", input=["hello", "world"])
        assert len(emb.data) == 2
        assert len(emb.data[0].embedding) == 64
        assert any(abs(x) > 0 for x in emb.data[0].embedding)

        engines = node.engine_pids()
        assert engines, "the engine should run as its own process"
    finally:
        code = node.stop(signal.SIGTERM)
    # uvicorn re-raises the signal after a clean shutdown, as daemons should.
    assert code in (0, -signal.SIGTERM), node.log()
    assert "Application shutdown complete" in node.log()
    assert node.engine_pids() == [], "engines must not outlive the node"


def test_bad_input_is_refused_and_the_node_keeps_serving(main_node) -> None:  # type: ignore[no-untyped-def]
    url = main_node.url + "/v1/chat/completions"
    auth = {"authorization": f"Bearer {main_node.key}"}
    good = {"model": "tiny", "messages": CHAT}

    def check(resp: httpx.Response, status: int, words: str) -> None:
        assert resp.status_code == status, resp.text
        error = resp.json()["error"]
        assert set(error) >= {"message", "type", "code"}
        assert words in error["message"], error

    check(httpx.post(url, json=good), 401, "Missing API key")
    check(
        httpx.post(url, json=good, headers={"authorization": "Bearer li-wrong"}),
        401,
        "Incorrect API key",
    )
    check(httpx.post(url, json={**good, "model": "nope"}, headers=auth), 404, "'nope' does not")
    check(
        httpx.post(url, content=b'{"model": "tiny", "messages": [', headers=auth),
        400,
        "not valid JSON",
    )
    check(httpx.post(url, json={**good, "max_tokens": "ten"}, headers=auth), 400, "max_tokens")
    check(httpx.post(url, json={**good, "messages": "hi"}, headers=auth), 400, "messages")
    check(httpx.post(url, json={"model": "tiny"}, headers=auth), 400, "Missing required")
    check(httpx.post(url, json={**good, "temperature": 9}, headers=auth), 400, "temperature")
    check(httpx.post(url, content=b"[1, 2]", headers=auth), 400, "JSON object")
    big = {**good, "messages": [{"role": "user", "content": "x" * 70_000}]}
    check(httpx.post(url, json=big, headers=auth), 413, "larger than the limit")

    # The official client maps these to its own exception types.
    client = main_node.client()
    with pytest.raises(openai.AuthenticationError):
        main_node.client(key="li-wrong").models.list()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-5", messages=CHAT)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=0)

    # Unknown routes are OpenAI-shaped too.
    check(httpx.get(main_node.url + "/v1/nothing", headers=auth), 404, "Not Found")

    reply = client.chat.completions.create(model="tiny", messages=CHAT)
    assert reply.choices[0].message.content == SENTENCE


def test_request_id_is_echoed_and_generated(main_node) -> None:  # type: ignore[no-untyped-def]
    url = main_node.url + "/v1/chat/completions"
    auth = {"authorization": f"Bearer {main_node.key}"}
    body = {"model": "tiny", "messages": CHAT}
    mine = httpx.post(url, json=body, headers={**auth, "x-request-id": "client-42"})
    assert mine.headers["x-request-id"] == "client-42"
    odd = httpx.post(url, json=body, headers={**auth, "x-request-id": "bad id\twith tabs"})
    assert odd.headers["x-request-id"] != "bad id\twith tabs"
    assert len(odd.headers["x-request-id"]) == 32


def test_doctor_on_a_healthy_running_node_exits_0(main_node) -> None:  # type: ignore[no-untyped-def]
    done = main_node.cli("doctor", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["failures"] == 0
    found = {f["check"]: f for f in report["findings"]}
    # its own ports are busy, with the node itself: that is healthy
    gateway = found[f"port {main_node.port}"]
    assert gateway["level"] == "ok" and "in use by this node" in gateway["message"]
    assert found["engine xllamacpp"]["level"] == "ok"
    assert (
        found["certificate"]["level"] == "ok" and "valid until" in found["certificate"]["message"]
    )
    text = main_node.cli("doctor")
    assert text.returncode == 0 and "no failures" in text.stdout
