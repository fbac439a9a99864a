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


def test_an_engine_that_is_healthy_but_cannot_answer_is_never_ready(tmp_path: Path) -> None:
    """Ready means proven: /health is not enough. An engine whose one real
    request fails never reaches routing, and is parked after N such starts."""
    import asyncio

    from letsinfer.agent.ports import free_port
    from letsinfer.agent.supervisor import EngineStatus, EngineSupervisor, SupervisionPolicy
    from letsinfer.engines.launch import EngineTask, LaunchPlan, plan_llamacpp
    from letsinfer.engines.releases import xllamacpp_cpu
    from letsinfer.engines.tinymodel import write_tiny_model

    model = write_tiny_model(tmp_path / "m.gguf")
    seen: list[EngineStatus] = []

    def plan(port: int) -> LaunchPlan:
        # Embeddings off, yet proven by an embedding: healthy, never answering.
        task = EngineTask(
            "pg-x",
            "m",
            model,
            "127.0.0.1",
            port,
            "key",
            threads=1,
            context=256,
            parallel=1,
            embedding=False,
            proof="embedding",
        )
        return plan_llamacpp(xllamacpp_cpu(), task, tmp_path)

    async def scenario() -> None:
        policy = SupervisionPolicy(backoff_initial_s=0.1, park_after_failed_starts=2)
        supervisor = EngineSupervisor(tmp_path, policy, seen.append)
        supervisor.ensure("pg-x", plan, free_port)
        while not any(s.state == "parked" for s in seen):
            await asyncio.sleep(0.1)
        await supervisor.stop_all()

    asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    assert "ready" not in {s.state for s in seen}
    [parked] = [s for s in seen if s.state == "parked"]
    assert parked.detail and "not proven" in parked.detail and "HTTP 501" in parked.detail
