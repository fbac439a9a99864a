"""What the gateway accepts of a request body, and what it says of one it
refuses: the same whichever JSON parser read it (pydantic's for speed, the
standard one for anything pydantic refuses)."""

from __future__ import annotations

import json

import pytest

from letsinfer.gateway import protocol
from letsinfer.gateway.errors import GatewayError, engine_refusal

MESSAGES = '"messages":[{"role":"user","content":"hi"}]'


def by_json_module(body: bytes, route: protocol.Route) -> protocol.Body:
    """The reference: the standard library's parser, then validation."""
    return route.schema.validate_python(json.loads(body))  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "body",
    [
        '{"model":"m",' + MESSAGES + "}",
        '{"model":"m",' + MESSAGES + ',"temperature":1,"max_tokens":5,"stream":true}',
        '{"model":"m",' + MESSAGES + ',"stream_options":{"include_usage":true},"x":[1,{"y":null}]}',
        '{"model":"a","model":"b",' + MESSAGES + "}",  # the last one wins, as in json
        '{"model":"m","messages":[{"role":"user","content":"\\ud800 lone"}]}',
        '{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"é"}]}]}',
    ],
)
def test_an_accepted_body_reads_the_same(body: str) -> None:
    raw = body.encode()
    parsed = protocol.parse(raw, protocol.CHAT)
    assert parsed == by_json_module(raw, protocol.CHAT)  # unknown fields kept alike


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{nope", "The request body is not valid JSON"),
        (b"[1, 2]", "The request body must be a JSON object."),
        (b'{"model":"m","messages":[]}', "Invalid value for 'messages'"),
        (b'{"messages":[{"role":"user","content":"x"}]}', "Missing required parameter: 'model'."),
        (b'{"model":"m",' + MESSAGES.encode() + b',"max_tokens":1.0}', "'max_tokens'"),
        (b'{"model":"m",' + MESSAGES.encode() + b',"max_tokens":true}', "'max_tokens'"),
        (b'{"model":"m",' + MESSAGES.encode() + b',"temperature":NaN}', "'temperature'"),
        (b'{"model":"m","messages":[{"role":"robot","content":"x"}]}', "'messages.0.role'"),
        (b'{"model":"m",' + MESSAGES.encode() + b',"n":2}', "'n'"),
        (b'{"model":"m",' + MESSAGES.encode() + b',"n_cmpl":4}', "'n_cmpl'"),  # llama.cpp's n
        (b'{"model":"m",' + MESSAGES.encode() + b',"n_predict":-2}', "'n_predict'"),
        (b"\xff\xfe{}", "The request body is not valid JSON"),
    ],
)
def test_a_refused_body_is_named_precisely(body: bytes, message: str) -> None:
    with pytest.raises(GatewayError) as refused:
        protocol.parse(body, protocol.CHAT)
    assert refused.value.status == 400
    assert message in refused.value.message


@pytest.mark.parametrize(
    "prompt",
    ['"one"', '["one"]', "[1, 2, 3]", "[[1, 2, 3]]", "[]"],
)
def test_a_completion_of_one_prompt_is_accepted(prompt: str) -> None:
    body = ('{"model":"m","prompt":' + prompt + "}").encode()
    assert protocol.parse(body, protocol.COMPLETION)["prompt"] == json.loads(prompt)


@pytest.mark.parametrize("prompt", ['["one", "two"]', "[[1], [2], [3]]"])
def test_a_completion_of_several_prompts_is_refused(prompt: str) -> None:
    # llama.cpp answers each, under one usage that counts one: every count
    # (records, limits, budgets) would see a fraction of the work.
    body = ('{"model":"m","prompt":' + prompt + "}").encode()
    with pytest.raises(GatewayError) as refused:
        protocol.parse(body, protocol.COMPLETION)
    assert refused.value.status == 400 and refused.value.param == "prompt"
    count = len(json.loads(prompt))
    assert f"it holds {count} prompts" in refused.value.message


@pytest.mark.parametrize(
    ("fields", "limit"),
    [
        ("", None),
        (',"max_tokens":5', 5),
        (',"max_tokens":1,"max_completion_tokens":900', 900),  # a provider may read either
        (',"max_tokens":1,"n_predict":700', 700),  # llama.cpp reads n_predict first
        (',"max_tokens":50,"n_predict":-1', None),  # llama.cpp: no limit at all
        (',"max_tokens":null', None),
    ],
)
def test_the_most_a_request_lets_the_model_write(fields: str, limit: int | None) -> None:
    body = ('{"model":"m",' + MESSAGES + fields + "}").encode()
    assert protocol.completion_limit(protocol.parse(body, protocol.CHAT)) == limit


def test_media_parts_are_found_whatever_else_the_parts_hold() -> None:
    def chat(*parts: object) -> protocol.Body:
        body = {"model": "m", "messages": [{"role": "user", "content": list(parts)}]}
        return protocol.parse(json.dumps(body).encode(), protocol.CHAT)

    for parts in ([{"type": "text", "text": "hi"}], [{"type": ["image_url"]}, {"x": 1}]):
        protocol.refuse_media(chat(*parts), "m")  # text, and parts of no known type
    with pytest.raises(GatewayError) as refused:
        protocol.refuse_media(chat({"type": "text", "text": "hi"}, {"type": "input_audio"}), "m")
    assert refused.value.status == 400 and refused.value.code == "unsupported_content"


def test_an_engines_refusal_is_reshaped_and_bounded() -> None:
    body = json.dumps({"error": {"code": 400, "message": "bad " + "x" * 10_000, "type": "x"}})
    err = engine_refusal("m", 400, body.encode(), "/v1/completions")
    error = json.loads(err.body())["error"]
    assert err.status == 400 and error["code"] == "engine_refused" and len(error["message"]) < 600
    assert engine_refusal("m", 404, b"not json", "/v1/completions").status == 404
    # The engine refusing the gateway's own key is not the client's error.
    assert engine_refusal("m", 401, body.encode(), "/v1/completions").status == 502
