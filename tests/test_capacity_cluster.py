"""Replicas that follow load, on a main and a child in network namespaces:
sustained requests above a model's target add a group on the other node;
calm removes it again, drained first, so no stream breaks. And a load on
demand on a child that reports only once a minute: the main's request to
report now and the child's report when its engine is ready carry it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from letsinfer.engines.tinymodel import write_tiny_model
from tests.cluster import Cluster, broken, streaming
from tests.netlab import NetLab

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    __import__("os").geteuid() != 0, reason="network namespaces need root"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("capacity-cluster")
    lab = NetLab(["main", "n1"]).up()
    c = Cluster(lab, root)
    fast = {"LETSINFER_ENGINE__THREADS": "1", "LETSINFER_ENGINE__PARALLEL": "2"}
    c.extra_env = {
        "main": {
            **fast,
            "LETSINFER_CAPACITY__INTERVAL_S": "0.2",
            "LETSINFER_CAPACITY__SCALE_UP_AFTER_S": "1",
            "LETSINFER_CONTROL__NODE_STALE_AFTER_S": "3",
        },
        "n1": fast,
    }
    try:
        c.main_with_children(("n1",))
        yield c
    finally:
        c.stop()
        lab.down()


def groups(c: Cluster, model: str) -> list[dict[str, object]]:
    return json.loads(c.ok("main", "model", "show", model, "--json"))["placement_groups"]  # type: ignore[no-any-return]


def audit_mark(c: Cluster) -> int:
    """The seq of the main's newest audit record: what a test counts from."""
    newest = json.loads(c.ok("main", "audit", "list", "--limit", "1", "--json"))
    return max((int(r["seq"]) for r in newest), default=0)


def audit_since(c: Cluster, mark: int) -> list[dict[str, object]]:
    return [r for r in c.audit("main") if int(str(r["seq"])) > mark]


def given_busy_once_on_main(c: Cluster) -> None:
    """Model busy with one ready group, on the main, held there (min = max =
    1): a test before may have left its group on n1 (a scale-down keeps either)."""
    if c.cli("main", "model", "show", "busy", "--json").returncode == 0 and any(
        g["node"] != "main" for g in groups(c, "busy")
    ):
        c.ok("main", "model", "remove", "busy", "--stop", timeout=120)
    if c.cli("main", "model", "show", "busy", "--json").returncode != 0:
        write_tiny_model(c.root / "busy.gguf", name="tiny-busy")
        c.ok("main", "model", "add", "busy", "--gguf", str(c.root / "busy.gguf"))
    c.ok("main", "model", "scale", "busy", "--min", "1", "--max", "1")
    c.wait(
        lambda: [(g["node"], g["state"]) for g in groups(c, "busy")] == [("main", "ready")],
        "busy serves, once, on the main",
    )


def test_load_above_the_target_adds_a_group_on_another_node_and_calm_removes_it(
    cluster: Cluster,
) -> None:
    c = cluster
    given_busy_once_on_main(c)
    mark = audit_mark(c)
    c.ok(
        "main",
        *("model", "scale", "busy", "--min", "1", "--max", "2"),
        *("--target-inflight", "1", "--scale-down", "3s"),
    )
    with streaming(c, "busy", threads=4) as results:
        c.wait(
            lambda: (
                sorted(str(g["node"]) for g in groups(c, "busy") if g["state"] == "ready")
                == ["main", "n1"]
            ),
            "a second group, on the child, while requests stay above the target",
            timeout=120,
        )
    assert results and not broken(results), (broken(results)[:3], len(results))
    c.wait(lambda: len(groups(c, "busy")) == 1, "one group fewer after the calm", timeout=60)
    records = audit_since(c, mark)
    loads = [r for r in records if r["action"] == "model.load" and r["target"] == "busy@n1"]
    assert loads and "requests in flight per group" in str(loads[-1]["detail"])
    scaled = [r for r in records if r["action"] == "model.scale" and r["target"] == "busy"]
    assert any("one group fewer" in str(r["detail"]) for r in scaled)


def test_a_scaled_down_group_drains_before_it_goes(cluster: Cluster) -> None:
    """While a group is drained for the scale-down, its streams finish whole:
    streams run through the whole scale-down and none breaks."""
    c = cluster
    if c.cli("main", "model", "show", "busy", "--json").returncode != 0:
        write_tiny_model(c.root / "busy.gguf", name="tiny-busy")
        c.ok("main", "model", "add", "busy", "--gguf", str(c.root / "busy.gguf"))
    c.ok("main", "model", "scale", "busy", "--min", "2", "--max", "2")
    c.wait(lambda: len(groups(c, "busy")) == 2, "two groups", timeout=120)
    c.wait(lambda: all(g["state"] == "ready" for g in groups(c, "busy")), "both ready", timeout=120)
    with streaming(c, "busy") as results:
        c.ok("main", "model", "scale", "busy", "--min", "1", "--max", "1")
        c.wait(lambda: len(groups(c, "busy")) == 1, "one group removed", timeout=60)
        time.sleep(1)
    assert results and not broken(results), (broken(results)[:3], len(results))


def test_a_child_lost_during_a_load_makes_the_main_place_it_elsewhere(cluster: Cluster) -> None:
    """The load goes to the child that holds the model's file, which dies (as
    a lost machine does) before its engine is ready: the main places the group
    again, here on itself, and the waiting request is answered."""
    c = cluster
    write_tiny_model(c.root / "roam.gguf", name="tiny-roam")
    if c.cli("main", "model", "show", "roam", "--json").returncode != 0:
        c.ok("main", "model", "add", "roam", "--gguf", str(c.root / "roam.gguf"), "--node", "n1")
        # Served on n1 once, so that n1 holds its file (where a load goes first).
        c.wait(
            lambda: [(g["node"], g["state"]) for g in groups(c, "roam")] == [("n1", "ready")],
            "roam served on n1",
            timeout=90,
        )
    c.ok("main", "model", "scale", "roam", "--min", "0", "--idle", "0s", "--min-resident", "0s")
    c.wait(lambda: not groups(c, "roam"), "roam unloaded", timeout=60)
    c.ok("main", "model", "scale", "roam", "--idle", "1h")
    mark = audit_mark(c)
    url = f"http://{c.lab.hosts['main']}:8000/v1/chat/completions"
    # The client starts first and waits for a line: its start-up (Python, httpx)
    # must not eat the few seconds n1's facts stay fresh after it dies.
    client = c.lab.popen(
        "main",
        PY,
        "-c",
        "import httpx, sys; sys.stdin.readline(); r = httpx.post(sys.argv[1], headers="
        "{'authorization': 'Bearer ' + sys.argv[2]}, json={'model': 'roam', 'messages': "
        "[{'role': 'user', 'content': 'hi'}]}, timeout=120); "
        "print(r.status_code, r.json()['choices'][0]['message']['content'])",
        url,
        str(c.key),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # n1 dies; its facts stay fresh for a few seconds, in which the load is
        # placed on it (it holds the file) and never comes up there.
        c.procs.pop("n1").kill()
        out, err = client.communicate("go\n", timeout=150)
    finally:
        if client.poll() is None:
            client.kill()
        c.up("n1")  # back for the other tests, whatever happened here
        c.wait(lambda: "n1" in active(c), "n1 back in the cluster", timeout=60)
    assert out.split(" ", 1)[0] == "200", err
    records = audit_since(c, mark)
    lost = [r for r in records if r["action"] == "model.unload" and r["target"] == "roam"]
    assert any("was lost during the load" in str(r["detail"]) for r in lost), lost
    assert any(r["action"] == "model.load" and r["target"] == "roam@main" for r in records)


def active(c: Cluster) -> set[str]:
    nodes = json.loads(c.ok("main", "node", "list", "--json"))
    return {n["name"] for n in nodes if n["state"] == "active"}


@pytest.fixture
def slow_heartbeat(tmp_path: Path) -> Iterator[Cluster]:
    """A main and one child, n1, whose heartbeat is a minute long once
    restarted (facts stay fresh that long on the main)."""
    lab = NetLab(["main", "n1"]).up()
    c = Cluster(lab, tmp_path)
    fast = {"LETSINFER_ENGINE__THREADS": "1", "LETSINFER_ENGINE__PARALLEL": "2"}
    fresh = {"LETSINFER_GATEWAY__FACT_MAX_AGE_S": "120"}
    c.extra_env = {
        "main": {
            **fast,
            **fresh,
            "LETSINFER_CAPACITY__INTERVAL_S": "0.2",
            "LETSINFER_CONTROL__NODE_STALE_AFTER_S": "180",
        },
        "n1": {**fast, **fresh},
    }
    try:
        c.main_with_children(("n1",))
        yield c
    finally:
        c.stop()
        lab.down()


def test_a_load_on_a_child_does_not_wait_for_its_heartbeats(slow_heartbeat: Cluster) -> None:
    """A cold request for an on-demand model whose file n1 holds: n1 reports
    once a minute, the queue waits 30 s at most, yet the request is answered
    from n1 (the main asks n1 to report as soon as it placed the load, and
    n1 reports again as soon as its engine is ready)."""
    c = slow_heartbeat
    write_tiny_model(c.root / "cold.gguf", name="tiny-cold")
    c.ok("main", "model", "add", "cold", "--gguf", str(c.root / "cold.gguf"), "--node", "n1")
    c.wait(
        lambda: [(g["node"], g["state"]) for g in groups(c, "cold")] == [("n1", "ready")],
        "cold served on n1 (so that n1 holds its file)",
        timeout=90,
    )
    c.ok("main", "model", "scale", "cold", "--min", "0", "--idle", "0s", "--min-resident", "0s")
    c.wait(lambda: not groups(c, "cold"), "cold unloaded", timeout=60)
    c.ok("main", "model", "scale", "cold", "--idle", "1h")
    # n1 again, now with a heartbeat of a minute; once the main has its first
    # report, the next is a minute away.
    stopped = time.time()
    n1 = c.procs.pop("n1")
    n1.terminate()
    n1.wait(timeout=30)
    c.extra_env["n1"]["LETSINFER_CONTROL__HEARTBEAT_INTERVAL_S"] = "60"
    c.up("n1")
    c.wait(lambda: last_seen(c, "n1") > stopped, "n1's first report", timeout=90)
    url = f"http://{c.lab.hosts['main']}:8000/v1/chat/completions"
    answer = c.lab.run(
        "main",
        PY,
        "-c",
        "import httpx, sys; r = httpx.post(sys.argv[1], headers={'authorization': 'Bearer '"
        " + sys.argv[2]}, json={'model': 'cold', 'messages': [{'role': 'user', 'content': "
        "'hi'}]}, timeout=120); print(r.status_code, r.text[:300])",
        url,
        str(c.key),
        timeout=150,
    )
    assert answer.stdout.split(" ", 1)[0] == "200", (answer.stdout, answer.stderr)
    loads = [r for r in c.audit("main") if r["action"] == "model.load"]
    assert loads and loads[-1]["target"] == "cold@n1", loads


def last_seen(c: Cluster, name: str) -> float:
    """When the main last heard from ``name`` (to the second), 0 if never."""
    nodes = json.loads(c.ok("main", "node", "list", "--json"))
    seen = next(n["last_seen"] for n in nodes if n["name"] == name)
    return datetime.fromisoformat(seen).timestamp() if seen else 0.0
