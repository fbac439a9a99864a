"""Weights from their origin, as an operator uses it: `model update` moves a pulled
model to a new commit of its repository one group at a time while clients
stream, `model rollback --weights` brings the old commit's bytes back, and a
gate (`--eval S --min-score X`, or `model gate`) keeps weights that fail it
from ever taking a client's request.

The hub is the local Hugging Face-compatible server the pull tests use
(tests/hubserver.py) on 127.0.0.1; a new commit is the same repository
published again with other bytes.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from letsinfer.contracts.artifacts import artifact_path
from letsinfer.engines.tinymodel import SENTENCE, write_tiny_model
from tests import json_docs
from tests.hubserver import FakeHub
from tests.nodes import RunningNode, processes_using, start_node
from tests.test_model_pull import TOKEN, hub_env

REPO = "org/evolving"
FILE = "evolving-Q8_0.gguf"
# The whole sentence passes it; only its first three words fail it.
CASE = "  - messages: [{role: user, content: hi}]\n    expect: {contains: 'llama.cpp'}\n"
PASSES = "name: says-it-all\nthreshold: 1\ncases:\n" + CASE * 30


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Four sets of weights for one repository: a, b and d answer the whole
    sentence (other bytes each), short answers only "Hello from letsinfer"."""
    folder = tmp_path_factory.mktemp("weights")
    return {
        "a": write_tiny_model(folder / "a.gguf", "Q8_0", name="evolving-a"),
        "b": write_tiny_model(folder / "b.gguf", "Q8_0", name="evolving-b"),
        "d": write_tiny_model(folder / "d.gguf", "Q8_0", name="evolving-d"),
        "short": write_tiny_model(folder / "short.gguf", "Q8_0", name="evolving-s", words=3),
    }


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    server = FakeHub(token=TOKEN).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, hub: FakeHub) -> Iterator[RunningNode]:
    root = tmp_path_factory.mktemp("update")
    running = start_node(root / "home", env=hub_env(hub, root))
    try:
        yield running
    finally:
        running.stop()


def ok(result: object) -> str:
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"  # type: ignore[attr-defined]
    return result.stdout  # type: ignore[attr-defined,no-any-return]


def shown(node: RunningNode) -> dict[str, object]:
    return json.loads(ok(node.cli("model", "show", REPO, "--json")))  # type: ignore[no-any-return]


def groups(node: RunningNode) -> list[str]:
    info = shown(node)
    return sorted(g["id"] for g in info["placement_groups"])  # type: ignore[attr-defined,index]


def publish(hub: FakeHub, path: Path) -> str:
    return hub.add_repo(REPO, {FILE: path, "README.md": b"# evolving\n"})


def chat(node: RunningNode, timeout: float = 60) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.post(
            node.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {node.key}"},
            json={"model": REPO, "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.3)


class Streamer:
    """``clients`` clients each streaming chat completions one after another
    until stopped (more than one at once: the gateway spreads them over every
    group that admits them), keeping every answer and every failure."""

    def __init__(self, node: RunningNode, clients: int = 1) -> None:
        self.node = node
        self.answers: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Streamer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self) -> None:
        body = {"model": REPO, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        auth = {"authorization": f"Bearer {self.node.key}"}
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                text = ""
                try:
                    with client.stream(
                        "POST", self.node.url + "/v1/chat/completions", json=body, headers=auth
                    ) as r:
                        if r.status_code != 200:
                            self.failures.append(f"{r.status_code}: {r.read()[:300]!r}")
                            continue
                        for line in r.iter_lines():
                            if line.startswith("data: {"):
                                delta = json.loads(line[6:])["choices"][0]["delta"]
                                text += delta.get("content") or ""
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                self.answers.append(text)


def audit(node: RunningNode, action: str, after: int = 0) -> list[dict[str, object]]:
    """The audit records of ``action``, those after record ``after`` (its seq)."""
    rows = json.loads(ok(node.cli("audit", "list", "--json")))
    return [r for r in rows if r["action"] == action and int(r["seq"]) > after]


def last_audit_seq(node: RunningNode) -> int:
    rows = json.loads(ok(node.cli("audit", "list", "--limit", "1", "--json")))
    return max((int(r["seq"]) for r in rows), default=0)


def given_model(node: RunningNode, hub: FakeHub, weights: dict[str, Path]) -> None:
    """REPO pulled and serving: pulled at weights a where there is no such model
    yet (a test before may have pulled and updated it)."""
    if node.cli("model", "show", REPO, "--json").returncode != 0:
        publish(hub, weights["a"])
        ok(node.cli("model", "pull", REPO, "--target", "cpu"))
    assert chat(node).status_code == 200


def given_no_model(node: RunningNode) -> None:
    """No model REPO: its groups stopped and gone, its weights history with it."""
    if node.cli("model", "show", REPO, "--json").returncode == 0:
        ok(node.cli("model", "remove", REPO, "--stop"))


def given_no_gate(node: RunningNode) -> None:
    """REPO has no gate (a test before may have set one)."""
    if json.loads(ok(node.cli("model", "gate", REPO, "--json")))["suite"] is not None:
        ok(node.cli("model", "gate", REPO, "--clear"))


def test_update_rolls_out_while_a_client_streams_and_rollback_restores_the_old_bytes(
    node: RunningNode, hub: FakeHub, weights: dict[str, Path]
) -> None:
    given_no_model(node)
    audited = last_audit_seq(node)
    commit_a = publish(hub, weights["a"])
    ok(node.cli("model", "pull", REPO, "--target", "cpu"))
    assert chat(node).status_code == 200
    before = groups(node)

    commit_b = publish(hub, weights["b"])
    with Streamer(node) as client:
        while len(client.answers) < 3:  # it streams before the update starts
            time.sleep(0.1)
        result = node.cli("model", "update", REPO, "--json")
        seen = len(client.answers)
        while len(client.answers) < seen + 3:  # and after it ended
            time.sleep(0.1)
    answer = json.loads(ok(result))
    assert client.failures == []
    assert set(client.answers) == {SENTENCE}
    assert [g["outcome"] for g in answer["placement_groups"]] == ["upgraded"] * len(before)
    assert answer["weights"] == {
        "sha256": sha256_of(weights["b"]),
        "commit": commit_b,
        "model_runs_them": True,
    }
    after = groups(node)
    assert len(after) == len(before) and not set(after) & set(before)  # each replaced
    info = shown(node)
    json_docs.conforms(info, "Model")
    assert (info["commit"], info["sha256"]) == (commit_b, sha256_of(weights["b"]))
    assert [(w["commit"], w["event"]) for w in info["weights"]] == [  # type: ignore[union-attr]
        (commit_a, "added"),
        (commit_b, "updated"),
    ]
    assert chat(node).json()["choices"][0]["message"]["content"] == SENTENCE

    again = json.loads(ok(node.cli("model", "update", REPO, "--json")))
    assert again == {"model": REPO, "commit": commit_b, "changed": False}

    # Back to commit a: its bytes come from the model store, not the hub.
    hub.seen.clear()
    back = json.loads(ok(node.cli("model", "rollback", REPO, "--weights", commit_a[:12], "--json")))
    assert [g["outcome"] for g in back["placement_groups"]] == ["upgraded"] * len(before)
    assert hub.seen == []
    info = shown(node)
    assert (info["commit"], info["sha256"]) == (commit_a, sha256_of(weights["a"]))
    # The engine serving it reads commit a's bytes again, and no engine b's.
    store = node.home / "var" / "models"
    stored = artifact_path(store, sha256_of(weights["a"]))
    assert stored.read_bytes() == weights["a"].read_bytes()
    assert processes_using(stored)
    deadline = time.monotonic() + 30
    while processes_using(artifact_path(store, sha256_of(weights["b"]))):
        assert time.monotonic() < deadline, "an engine still runs commit b"
        time.sleep(0.2)
    assert chat(node).json()["choices"][0]["message"]["content"] == SENTENCE
    assert [r["outcome"] for r in audit(node, "model.update", audited)] == ["ok"]
    assert [r["outcome"] for r in audit(node, "model.rollback.weights", audited)] == ["ok"]


def test_rollback_to_weights_the_model_never_ran_is_refused(
    node: RunningNode, hub: FakeHub, weights: dict[str, Path]
) -> None:
    given_model(node, hub, weights)
    before = shown(node)
    result = node.cli("model", "rollback", REPO, "--weights", "0123456789abcdef")
    assert result.returncode == 1
    assert "never ran weights '0123456789abcdef'" in result.stderr
    assert "Nothing changed." in result.stderr
    assert shown(node)["sha256"] == before["sha256"]


def test_weights_that_fail_the_gate_never_serve_and_the_old_keep_serving(
    node: RunningNode, hub: FakeHub, weights: dict[str, Path], tmp_path: Path
) -> None:
    suite = tmp_path / "says-it-all.yaml"
    suite.write_text(PASSES)
    given_model(node, hub, weights)
    serving = shown(node)
    before = groups(node)
    commit_short = publish(hub, weights["short"])

    with Streamer(node, clients=3) as client:
        while len(client.answers) < 3:
            time.sleep(0.1)
        result = node.cli(
            "model", "update", REPO, "--eval", str(suite), "--min-score", "0.5", "--json"
        )
        seen = len(client.answers)
        while len(client.answers) < seen + 2:
            time.sleep(0.1)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed the gate" in result.stdout and "below 0.5" in result.stdout
    assert "stopped" in result.stderr
    # No client ever got the short answer: the new group took none of their requests.
    assert client.failures == []
    assert set(client.answers) == {SENTENCE}
    gated = json.loads(result.stdout)["placement_groups"][0]
    assert gated["outcome"] == "gated"
    candidate = gated["gate"]["group"]
    assert gated["gate"]["score"] == 0.0 and gated["gate"]["passed"] is False
    assert groups(node) == before and candidate not in before
    info = shown(node)
    assert (info["commit"], info["sha256"]) == (serving["commit"], serving["sha256"])
    assert chat(node).json()["choices"][0]["message"]["content"] == SENTENCE
    # The gate's run is kept, pinned to the new group, and audited with its score.
    runs = json.loads(ok(node.cli("eval", "runs", "--model", REPO, "--json")))
    assert [(r["group"], r["score"], r["passed"]) for r in runs[:1]] == [(candidate, 0.0, False)]
    run = json.loads(ok(node.cli("eval", "show", runs[0]["run"], "--json")))
    assert {c["answer"] for c in run["cases"]} == {"Hello from letsinfer"}  # the new weights'
    gates = audit(node, "model.gate")
    assert gates[-1]["outcome"] == "failed"
    assert "score=0.0000" in str(gates[-1]["detail"]) and "min_score=0.5" in str(
        gates[-1]["detail"]
    )
    assert commit_short not in json.dumps(shown(node))


def test_a_model_gate_they_pass_promotes_them(
    node: RunningNode, hub: FakeHub, weights: dict[str, Path], tmp_path: Path
) -> None:
    suite = tmp_path / "says-it-all.yaml"
    suite.write_text(PASSES)
    given_model(node, hub, weights)
    given_no_gate(node)
    assert "has no gate" in ok(node.cli("model", "gate", REPO))
    ok(node.cli("model", "gate", REPO, "--suite", str(suite), "--min-score", "0.9"))
    gate = json.loads(ok(node.cli("model", "gate", REPO, "--json")))
    json_docs.conforms(gate, "Gate")
    assert (gate["suite"], gate["min_score"]) == (str(suite), 0.9)
    assert shown(node)["gate"] == {"suite": str(suite), "min_score": 0.9}

    commit_d = publish(hub, weights["d"])
    answer = json.loads(ok(node.cli("model", "update", REPO, "--json")))
    first = answer["placement_groups"][0]
    assert first["outcome"] == "upgraded"
    assert (first["gate"]["score"], first["gate"]["passed"]) == (1.0, True)
    info = shown(node)
    assert (info["commit"], info["sha256"]) == (commit_d, sha256_of(weights["d"]))
    assert audit(node, "model.gate")[-1]["outcome"] == "ok"

    assert "cleared" in ok(node.cli("model", "gate", REPO, "--clear"))
    assert json.loads(ok(node.cli("model", "gate", REPO, "--json")))["suite"] is None


def test_gate_options_are_checked_before_anything_changes(
    node: RunningNode, hub: FakeHub, weights: dict[str, Path], tmp_path: Path
) -> None:
    given_model(node, hub, weights)
    given_no_gate(node)
    lone = node.cli("model", "update", REPO, "--eval", "arithmetic")
    assert lone.returncode == 2 and "--eval and --min-score go together" in lone.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nthreshold: 1\ncases: []\n")
    refused = node.cli("model", "gate", REPO, "--suite", str(bad), "--min-score", "0.5")
    assert refused.returncode == 2 and "--suite" in refused.stderr
    assert json.loads(ok(node.cli("model", "gate", REPO, "--json")))["suite"] is None
    pulled_nothing = node.cli("model", "update", "no-such-model")
    assert pulled_nothing.returncode == 1 and "no model 'no-such-model'" in pulled_nothing.stderr
