"""The usage event the gateway asks for on a client's behalf is counted and
taken out again, however the engine's bytes are cut; nothing else changes."""

from __future__ import annotations

import json

from letsinfer.gateway.stream_usage import MAX_PENDING, UsageFilter, ask_for_usage, counted

TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"say \\"usage\\": 1"}}]}\n\n'
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":23,"completion_tokens":14,'
    b'"total_tokens":37}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def relay(stream: bytes, cuts: list[int], strip: bool = True) -> tuple[bytes, UsageFilter]:
    f = UsageFilter(strip)
    out, start = [], 0
    for cut in [*cuts, len(stream)]:
        out.append(f.feed(stream[start:cut]))
        start = cut
    out.append(f.flush())
    return b"".join(out), f


def test_the_usage_event_is_removed_at_any_cut_and_nothing_else_is() -> None:
    stream = TOKEN * 3 + FINISH + USAGE + DONE
    wanted = TOKEN * 3 + FINISH + DONE
    for cut in range(1, len(stream)):
        out, f = relay(stream, [cut])
        assert out == wanted, cut
        assert (f.prompt_tokens, f.completion_tokens) == (23, 14)
    crlf = stream.replace(b"\n\n", b"\r\n\r\n")
    out, f = relay(crlf, [len(crlf) - 30])
    assert out == wanted.replace(b"\n\n", b"\r\n\r\n") and f.completion_tokens == 14


def test_an_event_that_never_ends_is_passed_on_not_held() -> None:
    # An engine or provider that sends "data: ..." without the blank line that
    # ends an event: the client gets it as it comes, and nothing is kept back
    # (and searched again at every read) past a bound.
    endless = b"data: " + b"x" * (4 * MAX_PENDING)
    f = UsageFilter()
    out = [f.feed(endless[i : i + 4096]) for i in range(0, len(endless), 4096)]
    assert sum(map(len, out[: len(out) // 2])) > 0  # under way, not only at the end
    assert len(f.pending) <= MAX_PENDING + 4096
    rest = USAGE + DONE  # then the stream ends as usual: its usage still counted
    assert b"".join(out) + f.feed(b"\n\n" + rest) + f.flush() == endless + b"\n\n" + DONE
    assert (f.prompt_tokens, f.completion_tokens) == (23, 14)


def test_usage_the_client_asked_for_is_counted_and_kept_however_it_is_cut() -> None:
    stream = TOKEN * 3 + FINISH + USAGE + DONE
    # The usage event cut in several places (a slow network): never lost.
    for start in range(len(TOKEN * 3 + FINISH), len(stream) - len(DONE), 7):
        cuts = [c for c in (start, start + 3, start + 11, start + 40) if c < len(stream)]
        out, f = relay(stream, cuts, strip=False)
        assert out == stream, start
        assert (f.prompt_tokens, f.completion_tokens) == (23, 14), start


def test_usage_the_engine_sends_on_its_own_stays() -> None:
    final = (
        b'data: {"choices":[{"text":"","index":0,"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}\n\n'
    )
    out, f = relay(TOKEN + final + DONE, [5])
    assert out == TOKEN + final + DONE
    assert (f.prompt_tokens, f.completion_tokens) == (4, 2)


def test_the_request_asks_for_usage_and_keeps_the_clients_own_options() -> None:
    body = b'{"model": "tiny", "stream": true, "messages": []}'
    asked = json.loads(ask_for_usage(body, None))
    assert asked == {**json.loads(body), "stream_options": {"include_usage": True}}
    body = b'{"model":"tiny","stream":true,"stream_options":{"include_usage":false,"x":1}}'
    asked = json.loads(ask_for_usage(body, {"include_usage": False, "x": 1}))
    assert asked["stream_options"] == {"include_usage": True, "x": 1}
    # Options given as null are replaced, not followed by a field the engine ignores.
    body = b'{"model":"tiny","stream":true,"stream_options":null}'
    usage, sent = counted(body, json.loads(body))
    assert json.loads(sent)["stream_options"] == {"include_usage": True} and usage.strip


def test_a_lone_surrogate_in_a_request_with_options_stays_escaped() -> None:
    # Python's json reads the escape; UTF-8 cannot carry it (it once answered 500).
    body = b'{"model":"tiny","stream":true,"stream_options":{},"prompt":"a\\ud800b"}'
    sent = ask_for_usage(body, {})
    sent.decode("utf-8")  # what the engine gets is valid UTF-8 ...
    asked = json.loads(sent)  # ... and the same request, with usage asked for
    assert asked["prompt"] == "a\ud800b" and asked["stream_options"] == {"include_usage": True}


def test_a_null_usage_in_every_event_is_kept_and_the_real_one_counted() -> None:
    # OpenAI's own API sends "usage":null in each chunk once usage is asked for.
    token = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}\n\n'
    stream = token * 4 + FINISH + USAGE + DONE
    for cut in range(1, len(stream), 5):
        out, f = relay(stream, [cut])
        assert out == token * 4 + FINISH + DONE, cut
        assert (f.prompt_tokens, f.completion_tokens) == (23, 14)


def test_a_usage_event_in_several_data_lines_or_with_no_space_is_counted_and_removed() -> None:
    # SSE lets an event carry an id and split its data over lines; the colon
    # may have no space after it.
    split = (
        b'data: {"choices":[],\n'
        b'data: "usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12}}\n'
        b"id: 7\n\n"
    )
    tight = USAGE.replace(b"data: ", b"data:").replace(b"23", b"4")
    for usage, counts in ((split, (3, 9)), (tight, (4, 14))):
        stream = TOKEN + FINISH + usage + DONE
        for cut in range(1, len(stream), 3):
            out, f = relay(stream, [cut])
            assert out == TOKEN + FINISH + DONE, (usage, cut)
            assert (f.prompt_tokens, f.completion_tokens) == counts, (usage, cut)
