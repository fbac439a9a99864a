"""A long operation from a workstation shows its progress as it goes: the
admin API streams what `model pull`, `model add` and `model update` say and
how far their downloads are (asked for with ``Accept: application/x-ndjson``),
then the answer it gives without the stream; the workstation's CLI shows it
with the progress display the main's CLI uses, and ends with the main's own
output and exit code (in-process: tests/admin_desk.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from letsinfer.cli.bundle import TerminalProgress
from tests.admin_desk import Desk, audited, store_state

PULL = ("model", "pull", "org/tiny-gguf", "--quant", "Q8_0", "--no-serve", "--name")
FILE = "tiny-gguf-Q8_0.gguf"
STREAM = {"accept": "application/x-ndjson"}


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """What the CLI's progress display and its printed lines were given, in order."""
    calls: list[tuple[Any, ...]] = []
    start, advance, finish = (
        TerminalProgress.start,
        TerminalProgress.advance,
        TerminalProgress.finish,
    )

    def started(self: TerminalProgress, description: str, total: int | None) -> None:
        calls.append(("start", description, total))
        start(self, description, total)

    def advanced(self: TerminalProgress, amount: int) -> None:
        calls.append(("advance", amount))
        advance(self, amount)

    def finished(self: TerminalProgress) -> None:
        calls.append(("finish",))
        finish(self)

    from letsinfer.cli import said

    say_here = said.say_here

    def printed(text: str, **how: Any) -> None:
        calls.append(("said", text))
        say_here(text, **how)

    monkeypatch.setattr(TerminalProgress, "start", started)
    monkeypatch.setattr(TerminalProgress, "advance", advanced)
    monkeypatch.setattr(TerminalProgress, "finish", finished)
    monkeypatch.setattr(said, "say_here", printed)  # as replay() prints a line
    return calls


def events(body: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines() if line]


def test_a_pull_from_a_workstation_shows_its_download_as_it_goes(
    desk: Desk, hub: Any, shown: list[tuple[Any, ...]]
) -> None:
    """The download's steps and what the pull says reach the workstation as
    events before the answer, each shown by the CLI as it comes (the steps
    on the progress display the main's CLI uses), and the output is the
    main's."""
    remote = desk.at_ws("op", *PULL, "from-ws")
    assert remote.code == 0, remote.err
    [body] = desk.streamed
    got = events(body)
    *before, answer = got
    assert answer["event"] == "answer" and answer["status"] == 200
    assert answer["body"]["model"] == "from-ws"
    kinds = [e["event"] for e in before]
    assert {"said", "start", "advance", "finish"} <= set(kinds)
    size = len(hub.repos["org/tiny-gguf"].files[FILE])
    first = kinds.index("start")
    steps = kinds.index("finish", first)
    assert sum(e["amount"] for e in before[first:steps] if e["event"] == "advance") == size

    # Shown as the events came: each line printed, each step on the display.
    rendered = [c for c in shown if c != ("finish",)]
    expected: list[tuple[Any, ...]] = []
    for e in before:
        if e["event"] == "said":
            expected.append(("said", e["line"]["text"]))
        elif e["event"] == "start":
            expected.append(("start", e["description"], e["total"]))
        elif e["event"] == "advance":
            expected.append(("advance", e["amount"]))
    assert rendered == expected
    # The answer is the plain one: its transcript names each step where it began.
    assert [line["text"] for line in answer["body"]["said"]] == [
        f"{e['description']} …" if e["event"] == "start" else e["line"]["text"]
        for e in before
        if e["event"] in ("said", "start")
    ]

    shown.clear()
    local = desk.at_main(*PULL, "from-main")
    assert local.code == 0, local.err
    assert remote.out.replace("from-ws", "from-main") == local.out
    assert remote.err == local.err and "is commit" in remote.err


def test_a_pull_asked_plainly_answers_whole_and_the_stream_ends_with_that_answer(
    desk: Desk, hub: Any
) -> None:
    """Without the header the answer is today's one JSON body; with it, the
    events end with the same status and body; a request refused before the
    work begins is refused plainly either way."""
    ask = {"repo": "org/tiny-gguf", "quant": "Q8_0", "no_serve": True}
    with desk.main.client("op") as op:
        plain = op.post("/v1/ops/models/pull", json={**ask, "name": "asked-plainly"})
        assert plain.status_code == 200
        assert plain.headers["content-type"] == "application/json"
        streamed = op.post(
            "/v1/ops/models/pull", json={**ask, "name": "asked-streamed"}, headers=STREAM
        )
        assert streamed.headers["content-type"].startswith("application/x-ndjson")
        last = events(streamed.text)[-1]
        assert last["event"] == "answer" and last["status"] == 200
        assert json.dumps(last["body"]).replace("asked-streamed", "asked-plainly") == json.dumps(
            plain.json()
        )
        for headers in ({}, STREAM):
            both = op.post(
                "/v1/ops/models/pull", json={**ask, "file": "a", "quant": "b"}, headers=headers
            )
            assert both.status_code == 400, headers
            assert both.json()["error"]["message"] == "give --file or --quant, not both"


def test_a_pull_refused_midway_ends_its_stream_with_the_main_s_error_and_exit_code(
    desk: Desk, hub: Any, shown: list[tuple[Any, ...]]
) -> None:
    """Bytes that are not the published sha256: the download was shown as it
    went, then the refusal, with the same words and exit code as on the main,
    and nothing changed."""
    hub.corrupt.add(FILE)
    store = desk.main.store
    before = store_state(store)
    remote = desk.at_ws("op", *PULL, "bad-ws")
    *progress, answer = events(desk.streamed[-1])
    assert answer["event"] == "answer" and answer["status"] == 409
    assert "sha256" in answer["body"]["error"]["message"]
    assert [e for e in progress if e["event"] == "start"]
    assert [c for c in shown if c[0] == "start"]
    local = desk.at_main(*PULL, "bad-ws")
    assert remote.code == local.code == 1
    assert (remote.out, remote.err) == (local.out, local.err)
    assert "sha256" in remote.err
    assert store_state(store) == before


def hung_up(app: Any, path: str, ask: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``app`` sent to a controller that asked for the stream and hung up
    after its first event; returns once the work it left running is done."""
    from letsinfer.control.ops import streamed

    body = json.dumps(ask).encode()
    sent: list[dict[str, Any]] = []

    async def hang_up() -> None:
        first_event = asyncio.Event()
        asked = False

        async def receive() -> dict[str, Any]:
            nonlocal asked
            if not asked:
                asked = True
                return {"type": "http.request", "body": body, "more_body": False}
            await first_event.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                first_event.set()

        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "scheme": "https",
            "server": ("main", 443),
            "client": ("127.0.0.1", 50000),
            "headers": [
                (b"host", b"main"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"accept", b"application/x-ndjson"),
            ],
        }
        await app(scope, receive, send)
        await asyncio.gather(*streamed.running)  # the work, left running

    asyncio.run(hang_up())
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    assert dict(start["headers"])[b"content-type"].startswith(b"application/x-ndjson")
    got = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    got_events = events(got.decode())
    assert got_events and all(e["event"] != "answer" for e in got_events)  # it left before
    return got_events


def test_a_controller_that_hangs_up_midway_does_not_stop_the_pull(desk: Desk, hub: Any) -> None:
    """The controller leaves after the first event: the pull still ends on
    the main, the model added and audited under the controller."""
    store = desk.main.store
    since = len(store.list_audit())
    ask = {"repo": "org/tiny-gguf", "quant": "Q8_0", "no_serve": True, "name": "left-behind"}
    hung_up(desk.main.as_controller("op"), "/v1/ops/models/pull", ask)
    assert "left-behind" in {s.name for s in store.list_services()}
    assert ("controller:op", "model.add", "ok") in audited(store, since)


def test_a_controller_that_hangs_up_midway_does_not_stop_an_update_s_rollout(
    running_desk: Desk, hub: Any, tmp_path: Path
) -> None:
    """Left after the download's first event, an update still rolls out on
    the main's loop: the model runs the new commit, audited under the
    controller, as if it had stayed."""
    from letsinfer.engines.tinymodel import write_tiny_model

    desk, store = running_desk, running_desk.main.store
    assert desk.at_main(*PULL, "up-left").code == 0
    newer = write_tiny_model(tmp_path / "newer.gguf", "Q8_0", name="newer")
    commit = hub.add_repo("org/tiny-gguf", {FILE: newer})
    since = len(store.list_audit())
    hung_up(desk.main.as_controller("op"), "/v1/ops/models/up-left/update-from-origin", {})
    [updated] = [s for s in store.list_services() if s.name == "up-left"]
    assert updated.origin is not None and updated.origin["commit"] == commit
    assert ("controller:op", "model.update", "ok") in audited(store, since)
