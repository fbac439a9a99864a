"""Parallel placement groups and data links across real nodes in namespaces.

A main and two children; one parallel group spans n1 and n2 (a CPU test
runtime behind the parallel-command protocol, signed as a cluster release),
and a single-device group runs on n1 alone. The group's endpoint is published
only when both tasks are ready and the n1–n2 data link is proven by both
agents; cutting that link pauses only that group until ``model resume``.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import PY, Cluster, as_node
from tests.netlab import NetLab, can_make_namespaces

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("parallel")
    lab = NetLab(["main", "n1", "n2"]).up()
    c = Cluster(lab, root)
    shim = root / "parallel-shim"
    shim.write_text(f'#!/bin/sh\nexec {PY} {ROOT / "tests/parallel_shim.py"} "$@"\n')
    shim.chmod(0o755)
    child = {
        "LETSINFER_ENGINE__THREADS": "1",
        "LETSINFER_ENGINE__PARALLEL": "2",
        "LETSINFER_LINKS__PROBE_INTERVAL_S": "0.5",
        "LETSINFER_LINKS__PROBE_TIMEOUT_S": "1",
        "LETSINFER_DISCOVERY__ENABLED": "false",
        "PARALLEL_SHIM_RECORD": str(root / "record"),
    }
    c.extra_env = {
        "main": {
            "LETSINFER_ENGINE__PARALLEL_COMMAND": str(shim),
            "LETSINFER_CONTROL__NODE_STALE_AFTER_S": "3",
            "LETSINFER_LINKS__PROOF_TTL_S": "5",
            "LETSINFER_ENGINE__THREADS": "1",
            "LETSINFER_DISCOVERY__ENABLED": "false",
        },
        "n1": {**child, "PARALLEL_SHIM_PIDS": str(root / "pids-n1")},
        "n2": {
            **child,
            "PARALLEL_SHIM_PIDS": str(root / "pids-n2"),
            "PARALLEL_SHIM_HOLD": str(root / "hold.flag"),
        },
    }
    try:
        c.main_with_children()
        from letsinfer.engines.tinymodel import write_tiny_model

        write_tiny_model(root / "tiny.gguf")
        for model in ("wide", "solo"):
            c.ok("main", "model", "add", model, "--gguf", str(root / "tiny.gguf"), "--no-serve")
        yield c
    finally:
        c.stop()
        lab.down()


def chat(c: Cluster, model: str) -> tuple[int, str]:
    """One chat completion through the main's gateway: (status, error message)."""
    url = f"http://{c.lab.hosts['main']}:8000/v1/chat/completions"
    out = c.py(
        "main",
        f"""
import json, httpx
r = httpx.post({url!r}, timeout=60, headers={{"authorization": "Bearer {c.key}"}},
               json={{"model": {model!r}, "max_tokens": 4,
                      "messages": [{{"role": "user", "content": "hi"}}]}})
err = r.json().get("error", {{}}).get("message", "") if r.status_code != 200 else ""
print(json.dumps([r.status_code, err]))
""",
    )
    status, message = json.loads(out)
    return int(status), str(message)


def group(c: Cluster, model: str) -> dict[str, object]:
    info = json.loads(c.ok("main", "model", "show", model, "--json"))
    [pg] = info["placement_groups"]
    return pg  # type: ignore[no-any-return]


def task_states(c: Cluster, model: str) -> dict[str, str]:
    return {str(t["task"]): str(t["state"]) for t in group(c, model)["tasks"]}  # type: ignore[attr-defined]


def link_state(c: Cluster, a: str, b: str) -> str | None:
    topo = json.loads(c.ok("main", "topology", "--json"))
    node = next(n for n in topo if n["name"] == a)
    return next((link["state"] for link in node["links"] if link["peer"] == b), None)


def actions(c: Cluster) -> list[tuple[str, str, str | None]]:
    return [(str(r["action"]), str(r["outcome"]), r.get("detail")) for r in c.audit("main")]  # type: ignore[misc]


def ensure_wide(c: Cluster) -> None:
    """The parallel group over n1 and n2 (when a test runs on its own)."""
    info = json.loads(c.ok("main", "model", "show", "wide", "--json"))
    if not info["placement_groups"]:
        c.ok("main", "model", "install", "wide", "--parallel", "--node", "n1", "--node", "n2")
    c.wait(lambda: chat(c, "wide")[0] == 200, "the parallel group serving", timeout=90)


def given_no_group(c: Cluster, model: str) -> None:
    """``model`` registered with no placement group (a test before may have placed it)."""
    if json.loads(c.ok("main", "model", "show", model, "--json"))["placement_groups"]:
        c.ok("main", "model", "remove", model, "--stop", timeout=120)
        c.ok("main", "model", "add", model, "--gguf", str(c.root / "tiny.gguf"), "--no-serve")


def test_a_two_task_group_is_published_only_after_both_tasks_are_ready(cluster: Cluster) -> None:
    c = cluster
    given_no_group(c, "wide")  # its subject is the group's creation
    hold = c.root / "hold.flag"
    hold.touch()  # n2's task answers its head but does not report ready
    out = c.ok(
        "main", "model", "install", "wide", "--parallel", "--node", "n1", "--node", "n2", "--yes"
    )
    assert "1 parallel placement group created" in out
    c.wait(
        lambda: task_states(c, "wide") == {"0": "ready", "1": "starting"},
        "the head ready while its worker is held",
        timeout=90,
    )
    c.wait(lambda: link_state(c, "n1", "n2") == "proven", "the n1–n2 data link proven")
    status, message = chat(c, "wide")
    assert status == 503 and "waiting for task(s) 1" in message, (status, message)
    assert group(c, "wide")["state"] != "ready"

    hold.unlink()
    c.wait(lambda: chat(c, "wide")[0] == 200, "the group to serve once both tasks are ready")
    assert task_states(c, "wide") == {"0": "ready", "1": "ready"}
    pg = group(c, "wide")
    assert pg["state"] == "ready"

    # Every task was handed the whole group and the group's key, never on a command line.
    tasks = {str(t["task"]): t for t in pg["tasks"]}  # type: ignore[attr-defined]
    for task in ("0", "1"):
        seen = json.loads((c.root / "record" / f"task-{task}.json").read_text())
        assert seen["has_group_key"] is True
        assert seen["tasks"] == [
            {"task": t, "address": tasks[t]["address"], "port": tasks[t]["port"]}
            for t in ("0", "1")
        ]
        assert not any(a.startswith("lie-") for a in seen["argv"])
    assert tasks["0"]["node"] == "n1" and tasks["1"]["node"] == "n2"
    assert tasks["0"]["address"] == c.lab.hosts["n1"]
    assert tasks["1"]["address"] == c.lab.hosts["n2"]
    assert any(a == "model.install" and "parallel" in (d or "") for a, _, d in actions(c))


def test_a_failed_task_unpublishes_the_whole_group(cluster: Cluster) -> None:
    c = cluster
    ensure_wide(c)
    hold = c.root / "hold.flag"
    hold.touch()  # the restarted worker stays not-ready
    worker = int((c.root / "pids-n2" / "task-1.pid").read_text())
    os.kill(worker, signal.SIGKILL)
    c.wait(lambda: chat(c, "wide")[0] == 503, "the group withdrawn when its worker died")
    assert task_states(c, "wide")["0"] == "ready", "the head itself kept running"
    hold.unlink()
    c.wait(lambda: chat(c, "wide")[0] == 200, "the group back once its worker is ready")


def test_core_never_splits_a_single_device_runtime(cluster: Cluster) -> None:
    c = cluster

    def groups() -> list[str]:
        info = json.loads(c.ok("main", "model", "show", "solo", "--json"))
        return [str(pg["id"]) for pg in info["placement_groups"]]

    before = groups()  # none, or those a test before placed
    split = c.cli(
        "main",
        "model",
        "install",
        "solo",
        "--parallel",
        "--engine",
        "xllamacpp",
        "--node",
        "n1",
        "--node",
        "n2",
        "--yes",
    )
    assert split.returncode == 1
    assert "single-device runtime" in split.stderr and "Nothing changed" in split.stderr
    alone = c.cli("main", "model", "install", "solo", "--parallel", "--node", "n1", "--yes")
    assert alone.returncode == 1 and "two or more distinct nodes" in alone.stderr
    assert groups() == before
    denied = [d for a, o, d in actions(c) if a == "model.install" and o == "denied"]
    assert any("single-device runtime" in (d or "") for d in denied)


def _nft(c: Cluster, host: str, ruleset: str) -> None:
    path = c.root / f"{host}.nft"
    path.write_text(ruleset)
    result = c.lab.run(host, "nft", "-f", str(path))
    assert result.returncode == 0, result.stderr


def test_a_lost_link_pauses_only_the_group_that_needs_it(cluster: Cluster) -> None:
    c = cluster
    if not json.loads(c.ok("main", "model", "show", "solo", "--json"))["placement_groups"]:
        c.ok("main", "model", "install", "solo", "--node", "n1", "--target", "cpu", "--yes")
    c.wait(lambda: chat(c, "solo")[0] == 200, "the single-node group on n1 serving")
    ensure_wide(c)

    n2 = c.lab.hosts["n2"]
    _nft(
        c,
        "n1",
        "table inet lie_cut {\n"
        "  chain in { type filter hook input priority 0; ip saddr " + n2 + " drop; }\n"
        "  chain out { type filter hook output priority 0; ip daddr " + n2 + " drop; }\n"
        "}\n",
    )
    try:
        c.wait(lambda: link_state(c, "n1", "n2") == "lost", "the main to see the link lost")
        status, message = chat(c, "wide")
        assert status == 503 and "data link n1–n2 lost" in message, (status, message)
        assert [chat(c, "solo")[0] for _ in range(3)] == [200] * 3, "other groups keep serving"
        assert group(c, "wide")["paused"] == "data link n1–n2 lost"

        early = c.cli("main", "model", "resume", "wide")
        assert early.returncode == 1 and "must be proven again" in early.stderr
        assert group(c, "wide")["paused"] == "data link n1–n2 lost"
    finally:
        c.lab.run("n1", "nft", "delete", "table", "inet", "lie_cut")

    c.wait(lambda: link_state(c, "n1", "n2") == "proven", "the link proven again")
    status, message = chat(c, "wide")
    assert status == 503 and "model resume wide" in message, "still paused until resumed"
    c.ok("main", "model", "resume", "wide")
    c.wait(lambda: chat(c, "wide")[0] == 200, "the group serving after resume")
    assert group(c, "wide")["paused"] is None

    audit = actions(c)
    assert ("link.lost", "ok", None) in audit
    assert any(a == "model.pause" and "n1–n2" in (d or "") for a, _, d in audit)
    assert any(a == "model.resume" and o == "denied" for a, o, _ in audit)
    assert any(a == "model.resume" and o == "ok" and "unpaused" in (d or "") for a, o, d in audit)


def test_a_forged_link_proof_is_refused(cluster: Cluster) -> None:
    c = cluster
    ensure_wide(c)
    c.wait(lambda: link_state(c, "n1", "n2") == "proven", "the n1–n2 data link proven")
    nodes = {n["name"]: n for n in json.loads(c.ok("main", "node", "list", "--json"))}
    n2_id = nodes["n2"]["id"]
    home = c.home("n1")
    script = (
        as_node(home)
        + f"""
import secrets, time, httpx
from letsinfer.contracts.facts import Facts, LinkFact, sign
from letsinfer.links import proof
challenge, now = secrets.token_hex(32), time.time()
forged = proof.sign(pki.new_key(), node_id, "{n2_id}", "{c.lab.hosts["n2"]}", challenge, now)
link = LinkFact(peer="{n2_id}", address="{c.lab.hosts["n2"]}", proven_at=now,
                challenge=challenge, signature=forged, interface="eth0")
facts = Facts(node_id=node_id, seq=int(time.time() * 1000) + 10**6, ts=now, cpus=1,
              memory_bytes=1, targets=["cpu"], links=[link], version="x")
with httpx.Client(verify=ctx, timeout=10) as client:
    r = client.post("https://{c.lab.hosts["main"]}:8443/v1/agent/facts", json=sign(facts, key))
print(json.dumps([r.status_code, r.json()["error"]["message"]]))
"""
    )
    status, message = json.loads(c.py("n1", script))
    assert status == 422 and "refused link proof" in message, (status, message)
    assert "not signed by" in message
    # Refusals are gathered and written a moment later (bounded under a flood).
    c.wait(
        lambda: any(
            a == "node.facts" and o == "denied" and "refused link proof" in (d or "")
            for a, o, d in actions(c)
        ),
        "the main to audit the forged proof",
    )
    # The real agents' facts still pass: the link stays proven.
    assert link_state(c, "n1", "n2") == "proven"
    assert "data link → n2 [proven]" in c.ok("main", "topology")
