"""Capacity that follows demand, on one main node with one (fake) GPU and the
llama-server stand-in: two on-demand models that cannot be resident together
take turns on it, a pinned one is never evicted, an idle one unloads and comes
back for the next request, and a model that cannot fit is refused at once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from letsinfer.engines.tinymodel import SENTENCE, write_tiny_model
from tests.nodes import RunningNode, free_port, start_node

ROOT = Path(__file__).resolve().parent.parent
ONLY_GPU = "GPU-capacity-only-one"


def environment(root: Path) -> dict[str, str]:
    (root / "gpus.json").write_text(
        json.dumps([{"uuid": ONLY_GPU, "name": "Fake L4", "memory_total": 24 << 30}])
    )
    shim = root / "llama-server"
    shim.write_text(
        f'#!/bin/sh\nexec {sys.executable} {ROOT / "tests/llama_server_shim.py"} "$@"\n'
    )
    shim.chmod(0o755)
    return {
        "LETSINFER_HARDWARE__FAKE_GPUS": str(root / "gpus.json"),
        "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(shim),
        "LETSINFER_ENGINE__THREADS": "1",
        "LETSINFER_CAPACITY__INTERVAL_S": "0.2",
        "LETSINFER_CAPACITY__SETTLE_S": "0.5",
        "LETSINFER_GATEWAY__QUEUE_MAX_WAIT_S": "60",
        "LETSINFER_GATEWAY__METRICS_PORT": str(free_port()),  # `top` reads it
    }


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    root = tmp_path_factory.mktemp("capacity")
    running = start_node(root / "home", env=environment(root))
    try:
        yield running
    finally:
        running.stop()


def add_on_demand(node: RunningNode, name: str, *policy: str) -> None:
    """A model of its own bytes, registered only, then loaded on demand."""
    source = write_tiny_model(node.home.parent / f"{name}.gguf", name=f"tiny-{name}")
    added = node.cli("model", "add", name, "--gguf", str(source), "--min", "0", *policy)
    assert added.returncode == 0, added.stderr
    assert f"model {name}: on demand" in added.stdout


def given_on_demand(node: RunningNode, name: str, *policy: str) -> None:
    """Model ``name`` loaded on demand with ``policy`` (a test before may have
    added it, with a policy of its own)."""
    if not node_has(node, name):
        add_on_demand(node, name, *policy)
        return
    scaled = node.cli("model", "scale", name, "--min", "0", *policy)
    assert scaled.returncode == 0, scaled.stderr


def audit(node: RunningNode, *actions: str) -> list[dict[str, object]]:
    records = json.loads(node.cli("audit", "list", "--json").stdout)
    return [r for r in records if r["action"] in actions]


def chat(node: RunningNode, model: str, stream: bool = False) -> str:
    client = node.client(timeout=120)  # the unmodified openai client
    if stream:
        chunks = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    return answer.choices[0].message.content or ""


def card(node: RunningNode, model: str) -> dict[str, object]:
    listed = httpx.get(
        f"{node.url}/v1/models", headers={"authorization": f"Bearer {node.key}"}, timeout=10
    ).json()
    found = [m for m in listed["data"] if m["id"] == model]
    return found[0] if found else {}  # (a model just added is listed within a second)


def groups(node: RunningNode, model: str) -> list[dict[str, object]]:
    shown = node.cli("model", "show", model, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["placement_groups"]  # type: ignore[no-any-return]


def wait(what: str, check: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_an_idle_on_demand_model_unloads_stays_listed_and_the_next_request_loads_it(
    node: RunningNode,
) -> None:
    add_on_demand(node, "idle", "--idle", "4s", "--min-resident", "0s")
    shown = json.loads(node.cli("model", "scale", "idle", "--json").stdout)
    assert shown["policy"]["min_groups"] == 0 and shown["policy"]["idle_s"] == 4.0
    assert card(node, "idle")["state"] == "unloaded"  # listed at zero groups, never a 404
    assert chat(node, "idle") == SENTENCE  # loads for its first request
    [first] = groups(node, "idle")
    wait("the idle model unloads", lambda: not groups(node, "idle"), timeout=30)
    assert card(node, "idle")["state"] == "unloaded"
    # Every view says so in the same word; /health does not fail for it.
    listed = json.loads(node.cli("model", "list", "--json").stdout)
    assert [m["state"] for m in listed if m["name"] == "idle"] == ["unloaded"]
    status = json.loads(node.cli("status", "--json").stdout)
    assert [m["state"] for m in status["models"] if m["name"] == "idle"] == ["unloaded"]
    health = httpx.get(
        f"{node.url}/health", headers={"authorization": f"Bearer {node.key}"}, timeout=10
    )
    assert health.json()["states"]["idle"] == "unloaded"
    top = node.cli("top", "--once", "--interval", "0.3")
    assert any(
        line.split("│")[1:3] and "idle" in line and "unloaded" in line
        for line in top.stdout.splitlines()
    ), top.stdout
    assert not [p for p in node.engine_pids() if str(first["pid"]) == str(p)], "engine gone"
    assert chat(node, "idle", stream=True) == SENTENCE  # a fresh engine, streamed
    [second] = groups(node, "idle")
    assert second["id"] != first["id"] and second["pid"] != first["pid"]
    assert card(node, "idle")["state"] == "loaded"
    loads = audit(node, "model.load")
    unloads = audit(node, "model.unload")
    assert [r["target"] for r in loads if str(r["target"]).startswith("idle@")]
    assert any(r["target"] == "idle" and "no request for" in str(r["detail"]) for r in unloads)


def test_two_models_that_cannot_both_fit_take_turns_without_thrashing(
    node: RunningNode,
) -> None:
    for name in ("left", "right"):
        given_on_demand(node, name, "--idle", "1h", "--min-resident", "2s")
    make_room(node)
    before = len(audit(node, "model.load"))
    started = time.monotonic()
    for turn in range(6):
        model = ("left", "right")[turn % 2]
        assert chat(node, model) == SENTENCE, model
    took = time.monotonic() - started
    loads = audit(node, "model.load")[before:]
    ours = [r for r in loads if str(r["target"]).split("@")[0] in ("left", "right")]
    # At most one swap per minimum residence (2 s), and the first load.
    assert 1 <= len(ours) <= 1 + took / 2.0, (len(ours), took)
    evictions = [r for r in audit(node, "model.evict") if r["target"] in ("left", "right")]
    assert evictions and all("makes room for" in str(r["detail"]) for r in evictions)


def make_room(node: RunningNode) -> None:
    """Models other tests left on the GPU may be evicted at once."""
    for name in ("idle", "pinned"):
        if node_has(node, name):
            node.cli("model", "scale", name, "--min", "0", "--idle", "1h", "--min-resident", "0s")


def test_a_stream_on_a_group_is_never_cut_by_the_load_of_another(
    node: RunningNode, tmp_path: Path
) -> None:
    make_room(node)
    for name in ("left", "right"):
        if not node_has(node, name):
            add_on_demand(node, name)
        node.cli("model", "scale", name, "--min", "0", "--idle", "1h", "--min-resident", "0s")
    assert chat(node, "left") == SENTENCE  # left holds the GPU
    flag = tmp_path / "finish"
    stream = subprocess.Popen(
        [
            *(sys.executable, str(ROOT / "tests/load_client.py"), "stream"),
            *(node.url, str(node.key), "left", str(flag)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert stream.stdout is not None and stream.stdout.readline().strip() == "STARTED"
    answered: list[str] = []
    other = threading.Thread(target=lambda: answered.append(chat(node, "right")))
    other.start()  # right needs left's GPU: it waits while left's request is in flight
    time.sleep(2)
    flag.touch()
    out, err = stream.communicate(timeout=60)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == 200 and summary["finish"] == "length", err  # whole
    assert summary["chunks"] > 100
    other.join(timeout=90)
    assert answered == [SENTENCE]  # then right loads in left's place


def test_a_pinned_model_is_never_evicted_and_one_that_cannot_fit_is_refused_at_once(
    node: RunningNode,
) -> None:
    given_on_demand(node, "right")  # the model that cannot fit beside it
    for name in ("left", "right", "idle"):  # nothing on the GPU before the pinned one
        if node_has(node, name):
            node.cli("model", "scale", name, "--min", "0", "--idle", "0s", "--min-resident", "0s")
    wait(
        "the GPU is free",
        lambda: all(not groups(node, n) for n in ("left", "right", "idle") if node_has(node, n)),
    )
    source = write_tiny_model(node.home.parent / "pinned.gguf", name="tiny-pinned")
    added = node.cli("model", "add", "pinned", "--gguf", str(source))  # placed: the GPU
    assert added.returncode == 0, added.stderr
    wait("pinned serves", lambda: card(node, "pinned").get("ready_replicas") == 1)
    [held] = groups(node, "pinned")
    assert held["gpus"] == [ONLY_GPU]
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as refused:
        chat(node, "right")
    assert time.monotonic() - started < 30, "refused at once, not after the queue's 60 s"
    assert refused.value.status_code == 503
    body = refused.value.response.json()["error"]
    assert body["code"] == "capacity_exhausted", body
    assert "retry-after" in refused.value.response.headers
    assert groups(node, "pinned") == [held] or groups(node, "pinned")[0]["id"] == held["id"]
    assert chat(node, "pinned") == SENTENCE
    denied = [r for r in audit(node, "model.load") if r["outcome"] == "denied"]
    assert any(r["target"] == "right" for r in denied)
    # scaling it to zero lets the others in again
    assert node.cli("model", "scale", "pinned", "--min", "0", "--idle", "0s").returncode == 0


def node_has(node: RunningNode, model: str) -> bool:
    return node.cli("model", "show", model, "--json").returncode == 0


def test_a_main_killed_during_a_load_claims_no_gpu_twice_and_serves_after(
    tmp_path: Path,
) -> None:
    env = environment(tmp_path)
    home = tmp_path / "home"
    first = start_node(home, env=env)
    try:
        add_on_demand(first, "cold", "--idle", "1h", "--min-resident", "0s")
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import httpx,sys; httpx.post(sys.argv[1] + '/v1/chat/completions', "
                "headers={'authorization': 'Bearer ' + sys.argv[2]}, json={'model': 'cold', "
                "'messages': [{'role': 'user', 'content': 'hi'}]}, timeout=120)",
                first.url,
                str(first.key),
            ]
        )
        wait("the load began", lambda: bool(audit(first, "model.load")), timeout=60)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=30)
        client.kill()
    finally:
        first.stop()
    second = start_node(home, env=env)
    second.key = first.key
    try:
        assert chat(second, "cold") == SENTENCE
        shown = groups(second, "cold")
        gpus = [g for pg in shown for g in pg["gpus"]]  # type: ignore[union-attr]
        assert len(gpus) == len(set(gpus)) <= 1, shown
        claims = second.cli("doctor", "--cluster", "--json")
        assert "held by 2 placement groups" not in claims.stdout
    finally:
        second.stop()


def test_eviction_takes_only_idle_on_demand_groups_past_their_residence() -> None:
    from letsinfer.capacity.eviction import Resident, choose, may_free_later
    from tests.test_capacity_swaps import resident as idle_group

    def resident(pg: str, **kw: object) -> Resident:
        return idle_group(pg, **{"min_resident_s": 60.0, **kw})

    busy = resident("busy", in_flight=1)  # a stream in flight: never
    young = resident("young", resident_s=10.0)  # within its minimum residence
    pinned = resident("pinned", on_demand=False)
    awaited = resident("awaited", waiting=2)  # requests wait for it
    assert choose([busy, young, pinned, awaited], "new") is None
    assert may_free_later([busy, young, pinned], "new")  # busy and young will free
    assert not may_free_later([pinned], "new")  # a pinned group never does
    cheap = resident("cheap", reload_s=1.0)
    used = resident("used", reload_s=1.0, recent_requests=50.0)
    slow = resident("slow", reload_s=30.0)
    assert choose([slow, used, cheap, busy], "new") == cheap
    assert choose([cheap], "cheap") is None  # never the model that is loading


def test_a_policy_that_cannot_be_is_refused_before_anything_changes(node: RunningNode) -> None:
    source = write_tiny_model(node.home.parent / "never.gguf", name="tiny-never")
    refused = node.cli("model", "add", "never", "--gguf", str(source), "--min", "3", "--max", "2")
    assert refused.returncode == 2 and "--max (2) must be at least --min (3)" in refused.stderr
    assert not node_has(node, "never"), "nothing added"
    bad = node.cli("model", "scale", "tiny", "--idle", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    unknown = node.cli("model", "scale", "no-such-model", "--min", "0")
    assert unknown.returncode == 1 and "no model 'no-such-model'" in unknown.stderr
    shown = json.loads(node.cli("model", "scale", "tiny", "--json").stdout)
    assert shown["policy"]["min_groups"] == 1 and not shown["policy"]["on_demand"]


def test_a_stream_that_waits_for_a_load_hears_so_and_then_gets_its_answer(
    tmp_path: Path,
) -> None:
    """The stream opens while its model loads and carries SSE comment lines
    (which OpenAI clients skip); the unmodified client reads the answer."""
    env = {**environment(tmp_path), "LLAMA_SHIM_SLOW_START": "5"}
    slow = start_node(tmp_path / "home", env=env)
    try:
        add_on_demand(slow, "slow", "--idle", "1h", "--min-resident", "0s")
        lines = []
        with httpx.stream(
            "POST",
            f"{slow.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {slow.key}", "x-request-id": "cold-stream"},
            json={"model": "slow", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            timeout=120,
        ) as reply:
            assert reply.status_code == 200
            lines = [line for line in reply.iter_lines() if line]
        assert lines[0] == ": waiting for model slow to load", lines[:3]
        data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        said = "".join(c["choices"][0]["delta"].get("content") or "" for c in data if c["choices"])
        assert said == SENTENCE and lines[-1] == "data: [DONE]"
        # `letsinfer request ID` says it waited for the load (the engine took
        # 5 s to start), and a request that found the model loaded did not.
        warm = httpx.post(
            f"{slow.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {slow.key}", "x-request-id": "warm-one"},
            json={"model": "slow", "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert warm.status_code == 200
        cold_record, warm_record = recorded(slow, "cold-stream"), recorded(slow, "warm-one")
        assert cold_record["load_wait_ms"] >= 5000, cold_record
        assert cold_record["queue_ms"] >= cold_record["load_wait_ms"] - 1
        assert warm_record["load_wait_ms"] is None, warm_record
        shown = slow.cli("request", "cold-stream")
        assert shown.returncode == 0 and "load_wait_ms" in shown.stdout, shown.stderr
        # unloaded again: the openai client, streaming, sees only the answer
        assert slow.cli("model", "scale", "slow", "--idle", "0s").returncode == 0
        wait("slow unloads", lambda: not groups(slow, "slow"), timeout=60)
        assert slow.cli("model", "scale", "slow", "--idle", "1h").returncode == 0
        assert chat(slow, "slow", stream=True) == SENTENCE
    finally:
        slow.stop()


def recorded(node: RunningNode, request_id: str) -> dict[str, object]:
    """The request's record (`request ID --json`), once the writer has it."""
    found: list[dict[str, object]] = []

    def look() -> bool:
        done = node.cli("request", request_id, "--json")
        found[:] = json.loads(done.stdout) if done.returncode == 0 else []
        return bool(found)

    wait(f"the record of {request_id}", look, timeout=30)
    return found[-1]


def test_a_policy_with_the_default_s_values_is_still_the_operator_s(tmp_path: Path) -> None:
    """`model scale NAME --min 1 --max 1` on a model with two groups means one
    fewer: the capacity controller must still see a policy to keep to (a model
    nobody scaled keeps the groups `model install` made)."""
    from letsinfer.capacity.policy import DEFAULT
    from letsinfer.capacity.setting import set_policy
    from letsinfer.store import AuthorityStore

    store = AuthorityStore(tmp_path / "authority.db")
    try:
        store.add_service("two", "0" * 64, 1, "gguf", None)
        store.add_service("untouched", "1" * 64, 1, "gguf", None)
        set_policy(store, "two", {"min_groups": 2, "max_groups": 2})
        set_policy(store, "two", {"min_groups": 1, "max_groups": 1})
        assert store.scaling_policies() == {"two": DEFAULT}
    finally:
        store.close()
