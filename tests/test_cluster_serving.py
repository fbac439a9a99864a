"""Cluster serving: a main and two children in namespaces, models placed on the
children, served through the main's gateway, surviving what operators see."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster import PY, Cluster, as_node
from tests.netlab import NetLab, can_make_namespaces
from tests.nodes import processes_using

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")

ROOT = Path(__file__).resolve().parent.parent
GPUS = [
    {"uuid": "GPU-n1-a", "name": "Fake H100", "memory_total": 80 << 30},
    {"uuid": "GPU-n1-b", "name": "Fake H100", "memory_total": 80 << 30},
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("serving")
    lab = NetLab(["main", "n1", "n2"]).up()
    c = Cluster(lab, root)
    shim = root / "llama-server"
    shim.write_text(f'#!/bin/sh\nexec {PY} {ROOT / "tests/llama_server_shim.py"} "$@"\n')
    shim.chmod(0o755)
    (root / "gpus.json").write_text(json.dumps(GPUS))
    c.extra_env = {
        "main": {
            "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(shim),
            "LETSINFER_CONTROL__NODE_STALE_AFTER_S": "3",
            "LETSINFER_ENGINE__THREADS": "1",
        },
        "n1": {
            "LETSINFER_HARDWARE__FAKE_GPUS": str(root / "gpus.json"),
            "LLAMA_SHIM_RECORD": str(root / "shim-env.json"),
            "LETSINFER_ENGINE__THREADS": "1",
            "LETSINFER_ENGINE__PARALLEL": "2",
        },
        "n2": {"LETSINFER_ENGINE__THREADS": "1", "LETSINFER_ENGINE__PARALLEL": "2"},
    }
    try:
        c.main_with_children()
        from letsinfer.engines.tinymodel import write_tiny_model

        write_tiny_model(root / "shared.gguf")
        c.ok("main", "model", "add", "shared", "--gguf", str(root / "shared.gguf"), "--no-serve")
        yield c
    finally:
        c.stop()
        lab.down()


def pgs(c: Cluster, model: str) -> dict[str, dict[str, object]]:
    info = json.loads(c.ok("main", "model", "show", model, "--json"))[0]
    return {str(pg["node"]): pg for pg in info["placement_groups"]}


def wait_ready(c: Cluster, model: str, nodes: set[str], timeout: float = 90) -> None:
    c.wait(
        lambda: {n for n, pg in pgs(c, model).items() if pg["state"] == "ready"} >= nodes,
        f"{model} ready on {nodes}",
        timeout=timeout,
    )


def load(c: Cluster, model: str, n: int = 24, threads: int = 4) -> list[int]:
    url = f"http://{c.lab.hosts['main']}:8000"
    result = c.lab.run(
        "main",
        PY,
        str(ROOT / "tests/load_client.py"),
        url,
        c.key,
        model,
        str(n),
        str(threads),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def served_by(c: Cluster, model: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in re.finditer(
        rf"served={re.escape(model)} pg=(pg-\w+) status=200", (c.root / "main.log").read_text()
    ):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def test_install_on_two_children_serves_through_both(cluster: Cluster) -> None:
    c = cluster
    out = c.ok(
        "main",
        "model",
        "install",
        "shared",
        "--node",
        "n1",
        "--node",
        "n2",
        "--target",
        "cpu",
        "--yes",
    )
    assert "install n1" in out.replace("  ", " ") and "2 placement group(s) created" in out
    wait_ready(c, "shared", {"n1", "n2"})
    assert load(c, "shared") == [200] * 24
    by_pg = served_by(c, "shared")
    placed = {str(pg["id"]) for pg in pgs(c, "shared").values()}
    assert set(by_pg) == placed, (by_pg, placed)
    # Children's engines listen inside [engine] port_first..port_last (the range
    # the firewall keeps to the main), on their data address.
    for node, pg in pgs(c, "shared").items():
        url = httpx.URL(str(pg["endpoint"]))
        assert url.host == c.lab.hosts[node] and 21000 <= (url.port or 0) <= 29999, pg

    topo = json.loads(c.ok("main", "topology", "--json"))
    n1 = next(n for n in topo if n["node"] == "n1")
    assert n1["targets"] == ["cpu", "cuda"] and {g["uuid"] for g in n1["gpus"]} == {
        "GPU-n1-a",
        "GPU-n1-b",
    }


def test_gpus_are_exclusive_and_exactly_visible(cluster: Cluster) -> None:
    c = cluster
    c.ok("main", "model", "add", "big", "--gguf", str(c.root / "shared.gguf"), "--no-serve")
    c.ok("main", "model", "install", "big", "--node", "n1", "--gpu", "GPU-n1-a", "--yes")
    wait_ready(c, "big", {"n1"})
    seen = json.loads((c.root / "shim-env.json").read_text())
    assert seen["CUDA_VISIBLE_DEVICES"] == "GPU-n1-a"
    assert pgs(c, "big")["n1"]["gpus"] == ["GPU-n1-a"]

    c.ok("main", "model", "add", "big2", "--gguf", str(c.root / "shared.gguf"), "--no-serve")
    taken = c.cli("main", "model", "install", "big2", "--node", "n1", "--gpu", "GPU-n1-a", "--yes")
    assert taken.returncode == 1
    assert "GPU-n1-a already belongs to an active placement group" in taken.stdout + taken.stderr
    assert pgs(c, "big2") == {}

    before = pgs(c, "shared")
    again = c.cli("main", "model", "install", "shared", "--node", "n1", "--target", "cpu", "--yes")
    assert again.returncode == 1 and "--replace-existing" in again.stderr
    assert {n: pg["id"] for n, pg in pgs(c, "shared").items()} == {
        n: pg["id"] for n, pg in before.items()
    }


def test_a_killed_child_engine_costs_no_request(cluster: Cluster) -> None:
    c = cluster
    wait_ready(c, "shared", {"n1", "n2"})
    victim = int(pgs(c, "shared")["n1"]["pid"])  # type: ignore[arg-type]
    url = f"http://{c.lab.hosts['main']}:8000"
    client = c.lab.popen(
        "main",
        PY,
        str(ROOT / "tests/load_client.py"),
        url,
        c.key,
        "shared",
        "200",
        "4",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    out, err = client.communicate(timeout=120)
    statuses = json.loads(out)
    assert statuses == [200] * 200, err
    c.wait(
        lambda: (
            pgs(c, "shared")["n1"]["state"] == "ready" and pgs(c, "shared")["n1"]["pid"] != victim
        ),
        "the killed engine to return",
    )


def test_pause_lets_a_stream_finish_and_moves_new_requests(cluster: Cluster) -> None:
    c = cluster
    wait_ready(c, "big", {"n1"})
    engine_pid = pgs(c, "big")["n1"]["pid"]
    flag = c.root / "paused.flag"
    url = f"http://{c.lab.hosts['main']}:8000"
    stream = c.lab.popen(
        "main",
        PY,
        str(ROOT / "tests/load_client.py"),
        "stream",
        url,
        c.key,
        "big",
        str(flag),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert stream.stdout is not None
    assert stream.stdout.readline().strip() == "STARTED"
    # The CLI asks the child's running agent (admin socket), which asks the main
    # over mutual TLS with the node's key.
    c.ok("n1", "node", "pause")
    assert ("local:root", "node.pause") in [(r["actor"], r["action"]) for r in c.audit("n1")]
    # The main applied it before answering: no wait before the next requests.
    before = served_by(c, "shared")
    assert load(c, "shared", n=12) == [200] * 12
    after = served_by(c, "shared")
    n1_pg, n2_pg = str(pgs(c, "shared")["n1"]["id"]), str(pgs(c, "shared")["n2"]["id"])
    assert after.get(n1_pg, 0) == before.get(n1_pg, 0), "a paused node admits nothing new"
    assert after[n2_pg] - before.get(n2_pg, 0) == 12
    flag.touch()
    out, _ = stream.communicate(timeout=60)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == 200 and summary["finish"] == "length"
    assert summary["chunks"] > 100

    c.ok("main", "node", "resume", "n1")
    c.wait(lambda: load(c, "big", n=2, threads=1) == [200, 200], "n1 admitting again")
    assert pgs(c, "big")["n1"]["pid"] == engine_pid, "pausing never restarts engines"


def test_forged_replayed_and_stale_facts_are_refused_and_audited(cluster: Cluster) -> None:
    c = cluster
    home = c.home("n1")
    script = (
        as_node(home)
        + f"""
import time, httpx
from letsinfer.agent.facts import Facts, sign
def facts(seq, ts):
    return Facts(node_id=node_id, seq=seq, ts=ts, cpus=1, memory_bytes=1, targets=["cpu"],
                 version="x")
out = {{}}
with httpx.Client(verify=ctx, timeout=10) as client:
    url = "https://{c.lab.hosts["main"]}:8443/v1/agent/facts"
    for name, env in (("forged", sign(facts(int(time.time() * 1000) + 10**6, time.time()),
                                       pki.new_key())),
                      ("replayed", sign(facts(1, time.time()), key)),
                      ("stale", sign(facts(int(time.time() * 1000) + 10**7, time.time() - 3600),
                                     key))):
        r = client.post(url, json=env)
        out[name] = [r.status_code, r.json()["error"]["message"]]
print(json.dumps(out))
"""
    )
    result = json.loads(c.py("n1", script))
    assert result["forged"][0] == 422 and "signature does not verify" in result["forged"][1]
    assert result["replayed"][0] == 422 and "replayed" in result["replayed"][1]
    assert result["stale"][0] == 422 and "stale" in result["stale"][1]
    denied = [
        r for r in c.audit("main") if r["action"] == "node.facts" and r["outcome"] == "denied"
    ]
    assert len(denied) >= 3


def test_a_stopped_child_becomes_unroutable_and_traffic_moves(cluster: Cluster) -> None:
    c = cluster
    wait_ready(c, "shared", {"n1", "n2"})
    proc = c.procs.pop("n2")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert processes_using(c.home("n2") / "var/models") == [], "its engines stop with it"

    def n2_unroutable() -> bool:
        health = json.loads(
            c.py(
                "main",
                f"""
import httpx
print(httpx.get("http://{c.lab.hosts["main"]}:8000/health",
                headers={{"authorization": "Bearer {c.key}"}}).text)""",
            )
        )
        return health["models"]["shared"] == 1

    c.wait(n2_unroutable, "the main to drop n2's placement group", timeout=15)
    assert load(c, "shared", n=8) == [200] * 8
    nodes = {n["name"]: n for n in json.loads(c.ok("main", "node", "list", "--json"))}
    c.wait(
        lambda: (
            {n["name"]: n for n in json.loads(c.ok("main", "node", "list", "--json"))}["n2"][
                "state"
            ]
            == "unreachable"
        ),
        "n2 listed as unreachable",
    )
    assert nodes["n1"]["state"] == "active"
