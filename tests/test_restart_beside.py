"""Restarts that keep a one-replica model answering, on one main node: `cluster
restart` starts a fresh engine beside the old one where the node has room,
and says so when a model must go dark instead (no free GPU)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from letsinfer.engines.tinymodel import write_tiny_lora, write_tiny_model
from tests.nodes import RunningNode, start_node

ROOT = Path(__file__).resolve().parent.parent
ONLY_GPU = "GPU-only-one"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    root = tmp_path_factory.mktemp("restart-beside")
    (root / "gpus.json").write_text(
        json.dumps([{"uuid": ONLY_GPU, "name": "Fake H100", "memory_total": 80 << 30}])
    )
    shim = root / "llama-server"
    shim.write_text(
        f'#!/bin/sh\nexec {sys.executable} {ROOT / "tests/llama_server_shim.py"} "$@"\n'
    )
    shim.chmod(0o755)
    env = {
        "LETSINFER_HARDWARE__FAKE_GPUS": str(root / "gpus.json"),
        "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(shim),
        "LETSINFER_ENGINE__THREADS": "1",
    }
    running = start_node(root / "home", env=env)
    try:
        yield running
    finally:
        running.stop()


def group(node: RunningNode, model: str) -> dict[str, object]:
    shown = node.cli("model", "show", model, "--json")
    assert shown.returncode == 0, shown.stderr
    [pg] = json.loads(shown.stdout)["placement_groups"]
    return pg  # type: ignore[no-any-return]


def ready(node: RunningNode, model: str, timeout: float = 90) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while (pg := group(node, model))["state"] != "ready":
        assert time.monotonic() < deadline, f"{model} not ready: {pg}\n{node.log()}"
        time.sleep(0.2)
    return pg


@contextlib.contextmanager
def streaming(node: RunningNode, model: str, root: Path) -> Iterator[list[dict[str, object]]]:
    """Two clients streaming one request after another while the block runs;
    afterwards the list holds every request's summary."""
    stop = root / f"streams-{time.monotonic_ns()}.stop"
    client = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests/load_client.py"),
            "streams",
            node.url,
            str(node.key),
            model,
            str(stop),
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results: list[dict[str, object]] = []
    try:
        time.sleep(1)  # under way before the block starts
        yield results
    finally:
        stop.touch()
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err
        results.extend(json.loads(out))


def test_a_one_replica_model_keeps_answering_through_a_cluster_restart(
    node: RunningNode, tmp_path: Path
) -> None:
    before = ready(node, "tiny")  # the default model: one cpu group on the main
    with streaming(node, "tiny", tmp_path) as results:
        done = node.cli("cluster", "restart")
    assert done.returncode == 0, done.stdout + done.stderr
    broken = [r for r in results if not (r["status"] == 200 and r["whole"])]
    assert results and not broken, (broken, len(results))
    after = ready(node, "tiny")
    assert after["id"] != before["id"] and after["pid"] != before["pid"]
    out = " ".join(done.stdout.split())
    assert f"{before['id']} ready: started afresh beside it as {after['id']} and proven" in out
    assert "tiny goes dark" not in out


def test_with_no_free_gpu_the_restart_says_the_model_goes_dark(
    node: RunningNode, tmp_path: Path
) -> None:
    source = write_tiny_model(tmp_path / "gpu.gguf")
    added = node.cli("model", "add", "on-the-gpu", "--gguf", str(source), "--no-serve")
    assert added.returncode == 0, added.stderr
    placed = node.cli("model", "install", "on-the-gpu", "--target", "cuda", "--yes")
    assert placed.returncode == 0, placed.stderr
    before = ready(node, "on-the-gpu")
    assert before["gpus"] == [ONLY_GPU]
    done = node.cli("cluster", "restart")
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert (
        f"{before['id']} on {before['node']}: no spare capacity (its node has 0 free GPU(s), "
        "it holds 1): on-the-gpu goes dark for the restart"
    ) in out
    assert f"{before['id']} ready: restarted in place" in out
    after = ready(node, "on-the-gpu")
    assert (after["id"], after["gpus"]) == (before["id"], [ONLY_GPU])
    assert after["pid"] != before["pid"]


def test_adding_and_removing_an_adapter_keeps_a_one_replica_model_answering(
    node: RunningNode, tmp_path: Path
) -> None:
    before = ready(node, "tiny")
    lora = write_tiny_lora(tmp_path / "tuned.gguf")
    with streaming(node, "tiny", tmp_path) as results:
        added = node.cli("model", "adapter", "add", "tiny", "tiny-tuned", "--gguf", str(lora))
        assert added.returncode == 0, added.stdout + added.stderr
        middle = ready(node, "tiny")
        removed = node.cli("model", "adapter", "remove", "tiny-tuned")
        assert removed.returncode == 0, removed.stdout + removed.stderr
    broken = [r for r in results if not (r["status"] == 200 and r["whole"])]
    assert results and not broken, (broken, len(results))
    after = ready(node, "tiny")
    assert len({before["id"], middle["id"], after["id"]}) == 3
    assert f"{before['id']} on {before['node']}: ready: started afresh beside it as " in " ".join(
        added.stdout.split()
    )
    assert f"{middle['id']} on {middle['node']}: ready: started afresh beside it as " in " ".join(
        removed.stdout.split()
    )
