"""Canaries (`model upgrade --canary`, `model promote|abort|canary`): one new
group takes its share of a model's requests, shown per side from the request
records; the split outlives a restart of the main; abort gives every request
back to the old group, promote moves the rest. And the routing split alone:
one side per request by the canary's share, none for a retry."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from letsinfer.gateway.admission import Admission, AdmissionLimits
from letsinfer.gateway.policy import RoutingPolicy
from letsinfer.gateway.routing import Replica, RoutingTable
from letsinfer.store.canaries import CanaryRecord
from tests import json_docs
from tests.admin_desk import Desk
from tests.nodes import RunningNode, letsinfer, start_node

ROOT = Path(__file__).resolve().parent.parent
MODEL = "tiny"  # the model `node init --main` serves
SMOKE = """\
name: smoke
threshold: 0.9
cases:
  - messages: [{role: user, content: "Say hello"}]
    expect: {contains: "Hello"}
"""


def shim(path: Path, flavour: str) -> Path:
    """A llama-server (the test shim); ``flavour`` makes its bytes, so its
    release, differ from another's."""
    path.write_text(
        f"#!/bin/sh\n# {flavour}\n"
        f'exec {sys.executable} {ROOT / "tests/llama_server_shim.py"} "$@"\n'
    )
    path.chmod(0o755)
    return path


@dataclass
class Lab:
    node: RunningNode
    root: Path
    env: dict[str, str]  # the node's settings (the node's own env adds its ports)
    first: str  # the release the model runs at the start: what the canary runs beside
    release: str  # a second release of the shim: what the canary runs

    def chat(self, client: httpx.Client) -> int:
        return client.post(
            self.node.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {self.node.key}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        ).status_code

    def chats(self, n: int) -> list[int]:
        with httpx.Client() as client:
            return [self.chat(client) for _ in range(n)]

    def ok(self, *args: str, timeout: float = 300) -> str:
        done = letsinfer(self.node.home, *args, env=self.node.env, timeout=timeout)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def groups(self) -> list[dict[str, Any]]:
        return json.loads(self.ok("model", "show", MODEL, "--json"))["placement_groups"]  # type: ignore[no-any-return]

    def wait_ready(self, n: int, timeout: float = 90) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            groups = self.groups()
            if len(groups) == n and all(g["state"] == "ready" for g in groups):
                return groups
            assert time.monotonic() < deadline, f"{groups}\n{self.node.log()}"
            time.sleep(0.2)

    def canary(self, answered: int, timeout: float = 30) -> dict[str, Any]:
        """`model canary --json` once the records hold ``answered`` requests."""
        deadline = time.monotonic() + timeout
        while True:
            shown = json.loads(self.ok("model", "canary", MODEL, "--json"))
            if shown["canary"]["requests"] + shown["stable"]["requests"] >= answered:
                return shown  # type: ignore[no-any-return]
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)

    def audit(self) -> list[dict[str, Any]]:
        return json.loads(self.ok("audit", "list", "--json"))  # type: ignore[no-any-return]

    def audit_mark(self) -> int:
        """The newest audit record's seq: what a test counts its records from."""
        newest = json.loads(self.ok("audit", "list", "--limit", "1", "--json"))
        return max((int(r["seq"]) for r in newest), default=0)

    def audit_since(self, mark: int) -> list[dict[str, Any]]:
        return [r for r in self.audit() if int(r["seq"]) > mark]

    def requests(self) -> int:
        """The model's requests in the usage records so far."""
        records = json.loads(self.ok("usage", "--by", "model", "--json"))
        return sum(int(r["requests"]) for r in records if r["model"] == MODEL)

    def restart(self) -> None:
        self.node.stop()
        key = self.node.key
        self.node = start_node(self.node.home, env=self.env)
        self.node.key = key


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("canary")
    home = root / "home"
    env = {
        "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(shim(root / "llama-server", "first")),
        "LETSINFER_ENGINE__THREADS": "1",
        # Records reach their file at once: `model canary` counts from them.
        "LETSINFER_REQUESTS__FLUSH_INTERVAL_S": "0.1",
    }
    init = letsinfer(home, "node", "init", "--main", "--name", "main", env=env)
    assert init.returncode == 0, init.stderr
    key = init.stdout.split("API key (shown once): ")[1].split()[0]
    node = start_node(home, env=env)
    node.key = key
    try:
        second = shim(root / "llama-server-2", "second")
        out = letsinfer(home, "release", "add", "--llama-server", str(second), "--target", "cpu")
        assert out.returncode == 0, out.stderr
        lab = Lab(node, root, env, "", out.stdout.split(": ", 1)[1].split()[0])
        [group] = lab.wait_ready(1)
        lab.first = str(group["release"])
        yield lab
    finally:
        lab_node = locals().get("lab")
        (lab_node.node if lab_node is not None else node).stop()


def given_on_first_release(lab: Lab) -> None:
    """The model has no canary and its one group runs the first release (a
    test before may have promoted a canary of the second)."""
    if letsinfer(lab.node.home, "model", "canary", MODEL, env=lab.node.env).returncode == 0:
        lab.ok("model", "abort", MODEL)
    if {str(g["release"]) for g in lab.wait_ready(1)} != {lab.first}:
        lab.ok("model", "upgrade", MODEL, "--release", lab.first)
    [group] = lab.wait_ready(1)
    assert group["release"] == lab.first, group


def test_a_30_percent_canary_gets_its_share_and_abort_returns_all_traffic(lab: Lab) -> None:
    given_on_first_release(lab)
    mark, served = lab.audit_mark(), lab.requests()
    [old] = lab.wait_ready(1)
    started = json.loads(
        lab.ok("model", "upgrade", MODEL, "--release", lab.release, "--canary", "30", "--json")
    )
    [out] = started["placement_groups"]
    assert (out["group"], out["outcome"], out["to"]) == (old["id"], "canary", lab.release), started
    canary = out["now"]
    groups = {g["id"]: g for g in lab.wait_ready(2)}
    assert (
        groups[canary]["release"] == lab.release and groups[old["id"]]["release"] == old["release"]
    )

    # One canary per model, and no whole upgrade under it.
    for args in (("--canary", "10"), ()):
        refused = letsinfer(
            lab.node.home,
            "model",
            "upgrade",
            MODEL,
            "--release",
            lab.release,
            *args,
            env=lab.node.env,
        )
        assert refused.returncode == 1 and "has a canary" in refused.stderr, refused.stderr

    assert set(lab.chats(300)) == {200}
    shown = lab.canary(300)
    json_docs.conforms(shown, "Canary")  # as docs/json.md says
    assert shown["group"] == canary and shown["percent"] == 30
    assert shown["canary"]["groups"] == [canary] and shown["stable"]["groups"] == [old["id"]]
    assert shown["canary"]["requests"] + shown["stable"]["requests"] == 300
    assert 60 <= shown["canary"]["requests"] <= 120, shown
    for side in ("canary", "stable"):
        assert shown[side]["errors"] == 0 and shown[side]["error_rate"] == 0
        latency = shown[side]["latency_ms"]
        assert latency["p50"] is not None and latency["p50"] <= latency["p95"]
    text = lab.ok("model", "canary", MODEL)
    assert canary in text and "30% of requests" in text

    # The split is stored: after a restart of the main it holds as before.
    lab.restart()
    lab.wait_ready(2)
    assert set(lab.chats(100)) == {200}
    after = lab.canary(400)
    took = after["canary"]["requests"] - shown["canary"]["requests"]
    assert 10 <= took <= 50, after

    # An eval pinned to the canary's group shows on its side only.
    smoke = lab.root / "smoke.yaml"
    smoke.write_text(SMOKE)
    lab.ok("eval", MODEL, "--suite", str(smoke), "--group", canary)
    scored = lab.canary(401)
    assert scored["canary"]["eval"]["group"] == canary, scored
    assert (scored["canary"]["eval"]["suite"], scored["canary"]["eval"]["score"]) == ("smoke", 1)
    assert scored["stable"]["eval"] is None

    aborted = json.loads(lab.ok("model", "abort", MODEL, "--json"))
    assert [(g["group"], g["outcome"]) for g in aborted["placement_groups"]] == [
        (canary, "aborted")
    ]
    [left] = lab.wait_ready(1)
    assert (left["id"], left["release"]) == (old["id"], old["release"])
    assert set(lab.chats(50)) == {200}
    gone = letsinfer(lab.node.home, "model", "canary", MODEL, env=lab.node.env)
    assert gone.returncode == 1 and "has no canary" in gone.stderr
    assert lab.requests() - served == 451
    actions = [(r["action"], r["outcome"]) for r in lab.audit_since(mark) if r["target"] == MODEL]
    assert ("model.canary.start", "ok") in actions and ("model.canary.abort", "ok") in actions


def test_promote_keeps_the_canary_and_moves_the_rest(lab: Lab) -> None:
    given_on_first_release(lab)
    mark = lab.audit_mark()
    [old] = lab.wait_ready(1)
    started = json.loads(
        lab.ok("model", "upgrade", MODEL, "--release", lab.release, "--canary", "50", "--json")
    )
    canary = started["placement_groups"][0]["now"]
    lab.wait_ready(2)
    promoted = json.loads(lab.ok("model", "promote", MODEL, "--json"))
    assert promoted["ok"] and promoted["action"] == "model.promote", promoted
    assert [(g["group"], g["outcome"], g["now"]) for g in promoted["placement_groups"]] == [
        (old["id"], "upgraded", canary)
    ]
    [now] = lab.wait_ready(1)
    assert (now["id"], now["release"]) == (canary, lab.release)
    assert set(lab.chats(20)) == {200}
    again = letsinfer(lab.node.home, "model", "promote", MODEL, env=lab.node.env)
    assert again.returncode == 1 and "has no canary" in again.stderr
    actions = [r["action"] for r in lab.audit_since(mark) if r["target"] == MODEL]
    assert "model.promote" in actions


# -- the split in the gateway alone ---------------------------------------------


def _table() -> RoutingTable:
    routing = RoutingTable()
    for pg in ("pg-old", "pg-new"):
        routing.publish(Replica(pg, MODEL, "http://127.0.0.1:1", "Bearer x", capacity=1000))
    return routing


def test_the_split_draws_one_side_per_request_by_its_share() -> None:
    routing = _table()
    everyone = routing.replicas(MODEL)
    assert routing.routed(MODEL) is everyone, "no canary: the same list, no draw"

    routing.set_canaries({MODEL: ("pg-new", 0.3)})
    sides = [tuple(r.pg_id for r in routing.routed(MODEL)) for _ in range(3000)]
    assert set(sides) == {("pg-new",), ("pg-old",)}
    assert 750 <= sides.count(("pg-new",)) <= 1050
    assert routing.replicas(MODEL) == everyone, "others (metrics, capacity) see every group"

    routing.drain({"pg-new"})  # leaving (an abort): every request to the others
    assert routing.routed(MODEL) == everyone
    routing.undrain({"pg-new"})
    routing.set_canaries({})
    assert routing.routed(MODEL) is routing.replicas(MODEL)


def test_a_retry_away_from_the_canary_is_not_held_to_its_side() -> None:
    routing = _table()
    routing.set_canaries({MODEL: ("pg-new", 0.99)})
    admission = Admission(routing, RoutingPolicy(), AdmissionLimits())
    for _ in range(50):
        replica = admission.take_now(MODEL, exclude=frozenset({"pg-new"}))
        assert replica is not None and replica.pg_id == "pg-old"
        admission.release(replica)


# -- from a workstation -----------------------------------------------------------


@pytest.mark.parametrize("extra", [["--json"], []])
def test_model_canary_from_a_workstation_is_what_the_main_prints(
    desk: Desk, extra: list[str]
) -> None:
    store = desk.main.store
    [pg] = store.list_placement_groups(service=MODEL)
    store.add_placement_group("pg-canary", MODEL, pg.node_id, pg.release_id, pg.target, ())
    with store.transaction():
        store.add_canary(
            CanaryRecord(MODEL, "pg-canary", 25, "release", "r2", pg.id, time.time(), "test")
        )
    remote = desk.at_ws("watcher", "model", "canary", MODEL, *extra)
    assert remote.code == 0, remote.err
    assert (remote.out, remote.err) == (desk.at_main("model", "canary", MODEL, *extra).out, "")
    assert "pg-canary" in remote.out and "r2" in remote.out

    refused = desk.at_ws("watcher", "model", "promote", MODEL)
    assert refused.code == 1 and "needs the operator role" in refused.err
    assert store.get_canary(MODEL) is not None
