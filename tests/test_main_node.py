"""A user's first hour: a main node on one machine, used with the official client."""

from __future__ import annotations

import csv
import io
import json
import signal
import time
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
    assert node.outlived == [], "engines must not outlive a node that stops"


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
    mine = httpx.post(url, json=body, headers={**auth, "x-request-id": "client-42"}, timeout=60)
    assert mine.headers["x-request-id"] == "client-42"
    odd = httpx.post(
        url, json=body, headers={**auth, "x-request-id": "bad id\twith tabs"}, timeout=60
    )
    assert odd.headers["x-request-id"] != "bad id\twith tabs"
    assert len(odd.headers["x-request-id"]) == 32


def test_request_records_and_usage_add_up_to_what_the_clients_saw(main_node) -> None:  # type: ignore[no-untyped-def]
    secrets = {
        name: json.loads(main_node.cli("auth", "key", "create", name, "--json").stdout)["key"]
        for name in ("alpha", "beta")
    }
    seen = {name: {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0} for name in secrets}

    def saw(name: str, prompt: int, completion: int = 0) -> None:
        seen[name]["prompt_tokens"] += prompt
        seen[name]["completion_tokens"] += completion
        seen[name]["requests"] += 1

    alpha, beta = main_node.client(secrets["alpha"]), main_node.client(secrets["beta"])
    reply = alpha.chat.completions.create(
        model="tiny", messages=CHAT, extra_headers={"x-request-id": "plain-alpha"}
    )
    assert reply.usage is not None
    saw("alpha", reply.usage.prompt_tokens, reply.usage.completion_tokens)
    asked = list(
        alpha.chat.completions.create(
            model="tiny", messages=CHAT, stream=True, stream_options={"include_usage": True}
        )
    )
    final = asked[-1].usage
    assert final is not None and asked[-1].choices == []
    saw("alpha", final.prompt_tokens, final.completion_tokens)
    text = alpha.completions.create(model="tiny", prompt="Once", max_tokens=2)
    assert text.usage is not None
    saw("alpha", text.usage.prompt_tokens, text.usage.completion_tokens)

    # A stream that did not ask for usage gets none (the gateway asked the
    # engine for it and took it out again), yet its tokens are counted.
    plain_stream = list(
        beta.chat.completions.create(
            model="tiny", messages=CHAT, stream=True, extra_headers={"x-request-id": "stream-beta"}
        )
    )
    assert all(chunk.usage is None and chunk.choices for chunk in plain_stream)
    assert "".join(c.choices[0].delta.content or "" for c in plain_stream) == SENTENCE
    saw("beta", reply.usage.prompt_tokens, reply.usage.completion_tokens)  # same prompt, answer
    streamed_text = list(beta.completions.create(model="tiny", prompt="Once", stream=True))
    last = streamed_text[-1].usage  # llama.cpp's own final chunk carries it
    assert last is not None
    saw("beta", last.prompt_tokens, last.completion_tokens)
    emb = beta.embeddings.create(model="tiny", input="hello")
    saw("beta", emb.usage.prompt_tokens)

    def summed() -> dict[str, dict[str, int]]:
        rows = json.loads(main_node.cli("usage", "--json").stdout)
        return {r["key"]: r for r in rows if r["key"] in seen}

    deadline = time.monotonic() + 15
    while {k: r["requests"] for k, r in summed().items()} != {k: 3 for k in seen}:
        assert time.monotonic() < deadline, summed()
        time.sleep(0.2)

    done = main_node.cli("usage", "--by", "key", "--csv")
    assert done.returncode == 0, done.stderr
    rows = {r["key"]: r for r in csv.DictReader(io.StringIO(done.stdout))}
    for name, want in seen.items():
        got = rows[name]
        assert int(got["requests"]) == want["requests"] and got["errors"] == "0"
        assert int(got["prompt_tokens"]) == want["prompt_tokens"], (name, got, want)
        assert int(got["completion_tokens"]) == want["completion_tokens"], (name, got, want)
        assert int(got["total_tokens"]) == want["prompt_tokens"] + want["completion_tokens"]

    [record] = json.loads(main_node.cli("request", "stream-beta", "--json").stdout)
    pg = json.loads(main_node.cli("model", "show", "tiny", "--json").stdout)
    assert record["key"] == "beta" and record["model"] == "tiny" and record["status"] == 200
    assert record["stream"] is True and record["endpoint"] == "chat"
    assert record["placement_group"] == pg["placement_groups"][0]["id"]
    assert record["node"] == pg["placement_groups"][0]["node"]
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )
    assert record["ttft_ms"] > 0 and record["duration_ms"] >= record["ttft_ms"]
    assert record["cached"] is False and record["charged_tokens"] is None  # its usage counted
    # The access log has the stream's real counts too.
    assert (
        f"request_id=stream-beta key=beta model=tiny served=tiny pg={record['placement_group']} "
        "status=200" in main_node.log()
    )
    assert (
        f"prompt_tokens={reply.usage.prompt_tokens} "
        f"completion_tokens={reply.usage.completion_tokens}"
    ) in next(line for line in main_node.log().splitlines() if "request_id=stream-beta" in line)

    # Records hold no text and no key secret.
    stored = b"".join(p.read_bytes() for p in (main_node.home / "var").glob("requests.db*"))
    for never in (SENTENCE, CHAT[0]["content"], "Once", *secrets.values()):
        assert never.encode() not in stored, never

    missing = main_node.cli("request", "no-such-request")
    assert missing.returncode == 1 and "no record of request 'no-such-request'" in missing.stderr
    later = main_node.cli("usage", "--since", "2999-01-01", "--json")
    assert later.returncode == 0 and json.loads(later.stdout) == []
    bad = main_node.cli("usage", "--since", "last tuesday")
    assert bad.returncode == 2 and "is not a date" in bad.stderr


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


def test_the_mains_own_engines_are_sized_by_its_engine_settings(tmp_path: Path) -> None:
    """`[engine] threads`, `context` and `parallel` size the main's own engines
    as they size a child's, and the gateway counts the slots the engine has."""
    node = start_node(
        tmp_path / "home",
        env={
            "LETSINFER_ENGINE__THREADS": "1",
            "LETSINFER_ENGINE__CONTEXT": "2048",
            "LETSINFER_ENGINE__PARALLEL": "2",
        },
    )
    try:
        [engine] = node.engine_pids()
        argv = Path(f"/proc/{engine}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        spec = json.loads(argv[-1])
        # n_ctx: the context of each of its slots, all of them
        assert (spec["threads"], spec["n_ctx"], spec["parallel"]) == (1, 2048 * 2, 2)
    finally:
        node.stop()
