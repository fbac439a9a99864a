"""The agent keeps engines alive: a killed engine comes back, and the gap is a clear 503."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx

from letsinfer.engines.tinymodel import SENTENCE
from tests.nodes import start_node

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def test_killed_engine_is_restarted_and_the_gap_is_503(tmp_path: Path) -> None:
    # A long first backoff makes the gap wide enough to observe.
    node = start_node(tmp_path / "home", env={"LETSINFER_AGENT__RESTART_BACKOFF_INITIAL_S": "3"})
    try:
        auth = {"authorization": f"Bearer {node.key}"}
        [engine] = node.engine_pids()
        os.kill(engine, signal.SIGKILL)

        started = time.monotonic()
        gap = httpx.post(node.url + "/v1/chat/completions", json=CHAT, headers=auth, timeout=10)
        assert time.monotonic() - started < 5, "a request in the gap must not hang"
        assert gap.status_code == 503, gap.text
        assert gap.headers["retry-after"]
        assert "no healthy replica" in gap.json()["error"]["message"]
        health = httpx.get(node.url + "/health", headers=auth)
        assert health.status_code == 503 and health.json()["models"] == {"tiny": 0}

        node.wait_healthy(timeout=60)
        after = httpx.post(node.url + "/v1/chat/completions", json=CHAT, headers=auth)
        assert after.status_code == 200
        assert after.json()["choices"][0]["message"]["content"] == SENTENCE
        assert node.engine_pids() and engine not in node.engine_pids()

        status = json.loads(node.cli("status", "--json").stdout)[0]
        [pg] = status["placement_groups"]
        assert pg["state"] == "ready" and pg["restarts"] == 1
    finally:
        node.stop()
    assert node.engine_pids() == []


def test_node_killed_outright_takes_its_engines_with_it(tmp_path: Path) -> None:
    node = start_node(tmp_path / "home")
    engines = node.engine_pids()
    assert engines
    node.proc.kill()  # no chance to clean up: the death signal must do it
    node.proc.wait()
    deadline = time.monotonic() + 10
    while node.engine_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert node.engine_pids() == []
