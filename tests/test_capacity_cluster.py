"""Replicas that follow load, on a main and a child in network namespaces:
sustained requests above a model's target add a group on the other node;
calm removes it again, drained first, so no stream breaks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from letsinfer.engines.tinymodel import write_tiny_model
from tests.cluster import Cluster
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


def test_load_above_the_target_adds_a_group_on_another_node_and_calm_removes_it(
    cluster: Cluster,
) -> None:
    c = cluster
    write_tiny_model(c.root / "busy.gguf", name="tiny-busy")
    c.ok("main", "model", "add", "busy", "--gguf", str(c.root / "busy.gguf"))
    c.wait(lambda: [g["state"] for g in groups(c, "busy")] == ["ready"], "busy serves on the main")
    c.ok(
        "main",
        *("model", "scale", "busy", "--min", "1", "--max", "2"),
        *("--target-inflight", "1", "--scale-down", "3s"),
    )
    stop = c.root / "stop-streams"
    url = f"http://{c.lab.hosts['main']}:8000"
    client = c.lab.popen(
        "main",
        *(PY, str(ROOT / "tests/load_client.py"), "streams", url, str(c.key), "busy"),
        *(str(stop), "4"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        c.wait(
            lambda: (
                sorted(str(g["node"]) for g in groups(c, "busy") if g["state"] == "ready")
                == ["main", "n1"]
            ),
            "a second group, on the child, while requests stay above the target",
            timeout=120,
        )
    finally:
        stop.touch()
        out, _ = client.communicate(timeout=120)
    results = json.loads(out)
    broken = [r for r in results if not (r["status"] == 200 and r["whole"])]
    assert results and not broken, (broken[:3], len(broken), len(results))
    c.wait(lambda: len(groups(c, "busy")) == 1, "one group fewer after the calm", timeout=60)
    records = c.audit("main")
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
    stop = c.root / "stop-drain"
    url = f"http://{c.lab.hosts['main']}:8000"
    client = c.lab.popen(
        "main",
        *(PY, str(ROOT / "tests/load_client.py"), "streams", url, str(c.key), "busy"),
        *(str(stop), "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1)
        c.ok("main", "model", "scale", "busy", "--min", "1", "--max", "1")
        c.wait(lambda: len(groups(c, "busy")) == 1, "one group removed", timeout=60)
        time.sleep(1)
    finally:
        stop.touch()
        out, _ = client.communicate(timeout=120)
    results = json.loads(out)
    broken = [r for r in results if not (r["status"] == 200 and r["whole"])]
    assert results and not broken, (broken[:3], len(broken), len(results))
