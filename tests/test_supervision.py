"""The agent keeps engines alive: a killed engine comes back, and the gap is a
clear 503. Engines outlive a node killed outright for a grace period: a node
started again in time adopts them, never a process that is not its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from letsinfer.agent import reattach
from letsinfer.engines.tinymodel import SENTENCE
from tests.nodes import RunningNode, free_port, start_node

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
        # (The gap's 503 may come before the node has seen the engine's exit.)
        deadline = time.monotonic() + 3
        while (health := httpx.get(node.url + "/health", headers=auth)).status_code == 200:
            assert time.monotonic() < deadline, "the engine's exit never reached /health"
            time.sleep(0.05)
        assert health.status_code == 503 and health.json()["models"] == {"tiny": 0}

        node.wait_healthy(timeout=60)
        after = httpx.post(node.url + "/v1/chat/completions", json=CHAT, headers=auth, timeout=60)
        assert after.status_code == 200
        assert after.json()["choices"][0]["message"]["content"] == SENTENCE
        assert node.engine_pids() and engine not in node.engine_pids()

        status = json.loads(node.cli("status", "--json").stdout)
        [pg] = status["placement_groups"]
        assert pg["state"] == "ready" and pg["restarts"] == 1
    finally:
        node.stop(signal.SIGINT)  # Ctrl-C in the terminal
    assert node.outlived == [], "Ctrl-C stops the node and its engines"


FOREIGN = """
import http.server, sys
class Any(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # answers everything, accepts every key
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Any).serve_forever()
"""


def _serves(node: RunningNode) -> str:
    reply = httpx.post(
        node.url + "/v1/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {node.key}"},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def _listening(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_killed_node_adopts_its_engines_back_never_a_foreign_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # The grace must outlast a node's start on a loaded machine (or the engine
    # leaves before it can be adopted); the end of the test waits it out.
    env = {"LETSINFER_AGENT__ORPHAN_GRACE_S": "20"}
    node = start_node(home, env=env)
    key = node.key
    foreign: subprocess.Popen[bytes] | None = None
    nodes = [node]
    try:
        [engine] = node.engine_pids()
        node.proc.kill()  # no chance to clean up
        node.proc.wait()
        assert node.engine_pids() == [engine], "an engine waits for its node to come back"

        # Started again within the grace period, the node adopts its engine.
        again = start_node(home, env=env)
        again.key = key
        nodes.append(again)
        assert again.engine_pids() == [engine]
        assert _serves(again) == SENTENCE
        [pg] = json.loads(again.cli("status", "--json").stdout)["placement_groups"]
        assert pg["state"] == "ready" and pg["pid"] == engine and pg["restarts"] == 0
        assert f"adopted the running engine of {pg['id']} (pid {engine})" in again.log()
        again.proc.kill()
        again.proc.wait()

        # Its record rewritten to name a foreign process on the engine's port
        # (which answers every key): never adopted, never signalled.
        [record_file] = (home / "run/engines").glob("*.engine.json")
        record = json.loads(record_file.read_text())
        os.kill(engine, signal.SIGKILL)
        while Path(f"/proc/{engine}").exists() and engine in again.engine_pids():
            time.sleep(0.05)
        # (A port of the tests' own: the engine's freed one may be taken meanwhile.)
        port = free_port()
        foreign = subprocess.Popen([sys.executable, "-c", FOREIGN, str(port)])
        deadline = time.monotonic() + 30
        while not _listening(port):
            assert time.monotonic() < deadline and foreign.poll() is None
            time.sleep(0.1)
        record.update(port=port, pid=foreign.pid, start_ticks=reattach.start_ticks(foreign.pid))
        record_file.write_text(json.dumps(record))
        third = start_node(home, env=env)
        third.key = key
        nodes.append(third)
        assert foreign.poll() is None, "a foreign process is never signalled"
        [fresh] = third.engine_pids()
        assert fresh != foreign.pid
        assert _serves(third) == SENTENCE
        assert f"not adopting the engine of {record['pg_id']} (pid {foreign.pid})" in third.log()
        assert "another command line" in third.log()

        # Nobody starts the node again: its engine stops by itself after the grace.
        third.proc.kill()
        third.proc.wait()
        deadline = time.monotonic() + 90
        while third.engine_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert third.engine_pids() == []
        assert "lease" in (home / f"var/logs/engines/{record['pg_id']}.log").read_text()
    finally:
        if foreign is not None:
            foreign.kill()
        for n in nodes:
            n.stop()


def test_an_engine_that_is_healthy_but_cannot_answer_is_never_ready(tmp_path: Path) -> None:
    """Ready means proven: /health is not enough. An engine whose one real
    request fails never reaches routing, and is parked after N such starts."""
    import asyncio

    from letsinfer.agent.supervisor import (
        EngineIdentity,
        EngineStatus,
        EngineSupervisor,
        SupervisionPolicy,
    )
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
        supervisor = EngineSupervisor(tmp_path, tmp_path, policy, seen.append)
        identity = EngineIdentity("pg-x", "0", "m", "placement", "release", "key")
        supervisor.ensure(identity, plan, free_port)
        while not any(s.state == "parked" for s in seen):
            await asyncio.sleep(0.1)
        await supervisor.stop_all()

    asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    assert "ready" not in {s.state for s in seen}
    [parked] = [s for s in seen if s.state == "parked"]
    assert parked.detail and "not proven" in parked.detail and "HTTP 501" in parked.detail
