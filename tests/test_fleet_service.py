"""``letsinfer service``: letsinfer's own supervisor, used as an operator would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from letsinfer.engines.tinymodel import SENTENCE
from tests.nodes import (
    command_lines,
    free_port,
    letsinfer,
    loopback_env,
    processes_using,
    start_node,
)

ROOT = Path(__file__).resolve().parent.parent


def test_service_start_detaches_a_serving_node_and_stop_ends_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = free_port()
    env = loopback_env(port)
    try:
        assert letsinfer(home, "service", "status", env=env).returncode == 3  # not running

        started = letsinfer(home, "service", "start", "--json", env=env, timeout=120)
        assert started.returncode == 0, started.stderr
        info = json.loads(started.stdout)
        assert info["started"] and info["initialised"] and info["role"] == "main"
        assert info["api_key"].startswith("li-")
        assert info["endpoint"] == f"http://127.0.0.1:{port}/v1"
        assert info["serving"], "started means its endpoint answers the next request"

        again = letsinfer(home, "service", "start", "--json", env=env)
        assert json.loads(again.stdout)["started"] is False
        assert json.loads(again.stdout)["api_key"] is None  # the key is shown once
        assert json.loads(again.stdout)["pid"] == info["pid"]

        status = letsinfer(home, "service", "status", "--json", env=env)
        assert status.returncode == 0 and json.loads(status.stdout)["pid"] == info["pid"]

        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers={"Authorization": f"Bearer {info['api_key']}"},
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            timeout=120,
        )
        assert reply.json()["choices"][0]["message"]["content"] == SENTENCE

        # `service restart` during a stream: the old process lets the stream
        # finish, leaves its engine serving, and the new one adopts it.
        [engine] = processes_using(home / "var/models")
        flag = tmp_path / "finish"
        stream = subprocess.Popen(
            [
                *(sys.executable, str(ROOT / "tests/load_client.py"), "stream"),
                *(f"http://127.0.0.1:{port}", info["api_key"], "tiny", str(flag)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert stream.stdout is not None and stream.stdout.readline().strip() == "STARTED"
        restart = subprocess.Popen(
            [sys.executable, "-m", "letsinfer", "--home", str(home), "service", "restart"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        node_log = home / "var/logs/node.log"
        # The old process shuts down while the client holds the stream: it waits
        # for the stream's connection, or, when the engine was fast enough that
        # the whole stream already sits in the sockets' buffers, it has nothing
        # left to send. Either way the client then reads the stream whole.
        deadline = time.monotonic() + 60
        while not any(
            line in node_log.read_text()
            for line in ("Waiting for connections to close", "Finished server process")
        ):
            assert time.monotonic() < deadline and restart.poll() is None, node_log.read_text()
            time.sleep(0.1)
        flag.touch()
        out, err = stream.communicate(timeout=60)
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["status"] == 200 and summary["finish"] == "length", err
        assert summary["chunks"] > 100
        out, err = restart.communicate(timeout=120)
        assert restart.returncode == 0, err
        assert f"restarted (pid {info['pid']} -> " in out and "1 engine(s) kept serving" in out
        assert processes_using(home / "var/models") == [engine], "the engine was never restarted"
        again = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers={"Authorization": f"Bearer {info['api_key']}"},
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            timeout=120,
        )
        assert again.json()["choices"][0]["message"]["content"] == SENTENCE

        stopped = letsinfer(home, "service", "stop", "--json", env=env, timeout=60)
        assert stopped.returncode == 0 and json.loads(stopped.stdout)["stopped"] is True
        assert letsinfer(home, "service", "status", env=env).returncode == 3
        assert json.loads(letsinfer(home, "service", "stop", "--json").stdout)["stopped"] is False
        assert processes_using(home) == []
        log = (home / "var/logs/node.log").read_text()
        assert "Application shutdown complete" in log
        assert info["api_key"] not in log  # shown once, by `service start` only
    finally:
        letsinfer(home, "service", "stop", env=env, timeout=60)


def test_service_start_waits_for_a_candidates_agent_not_a_gateway(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = free_port()
    env = loopback_env(port)
    try:
        init = letsinfer(home, "node", "init", "--name", "cand", env=env)
        assert init.returncode == 0, init.stderr
        started = letsinfer(home, "service", "start", "--json", env=env, timeout=120)
        assert started.returncode == 0, started.stderr
        info = json.loads(started.stdout)
        assert info["started"] and not info["initialised"] and info["role"] == "candidate"
        assert info["endpoint"] is None and info["api_key"] is None
        agent_port = int(env["LETSINFER_AGENT__API_PORT"])
        with socket.create_connection(("127.0.0.1", agent_port), timeout=5):
            pass  # the agent plane listens
        with socket.socket() as sock:  # and no gateway does
            assert sock.connect_ex(("127.0.0.1", port)) != 0
        status = json.loads(letsinfer(home, "status", "--json", env=env).stdout)
        assert status["running"] and status["role"] == "candidate" and status["fingerprint"]
    finally:
        letsinfer(home, "service", "stop", env=env, timeout=60)
    assert processes_using(home) == []


def test_service_start_reports_a_node_that_cannot_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = free_port()
    env = loopback_env(port)
    init = letsinfer(home, "service", "init", "--json", env=env)
    assert init.returncode == 0 and json.loads(init.stdout)["initialised"] is True
    assert json.loads(letsinfer(home, "service", "init", "--json").stdout)["api_key"] is None
    with socket.socket() as sock:  # something else holds the port
        sock.bind(("127.0.0.1", port))
        sock.listen()
        result = letsinfer(home, "service", "start", env=env, timeout=60)
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert letsinfer(home, "service", "status", env=env).returncode == 3
    assert processes_using(home) == []


def test_checkconfig_names_the_bad_key(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[gateway]\nport = 8000\n[engine]\nkind = "xllamacpp"\n')
    bad = tmp_path / "bad.toml"
    bad.write_text("[gateway]\nport = 70000\n")
    run = [sys.executable, "-m", "letsinfer.service.checkconfig"]
    assert subprocess.run([*run, str(good)], capture_output=True).returncode == 0
    result = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert result.returncode == 2 and "gateway.port" in result.stderr


def test_up_writing_to_a_log_keeps_the_first_key_out_of_it_and_leaves_no_pid_file(
    tmp_path: Path,
) -> None:
    """`letsinfer up` whose output is a file (a service's log, the journal) on a
    fresh home: the first API key goes to a 0600 file the log names, never into
    the log; Ctrl-C leaves no pid file behind."""
    home = tmp_path / "home"
    out = tmp_path / "node.log"
    port = free_port()
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "letsinfer", "--home", str(home), "up", "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **loopback_env(port)},
            # As a shell script's background job starts it: SIGINT ignored.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        deadline = time.monotonic() + 90
        while "Ctrl-C" not in out.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.02)  # (the signal is sent while the node still starts)
        assert (home / "run/node.pid").read_text().strip() == str(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        proc.wait(timeout=120)
    log = out.read_text()
    key_file = home / "etc/first-api-key"
    key = key_file.read_text().strip()
    assert key.startswith("li-") and key not in log
    assert f"API key   in {key_file}" in log
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert not (home / "run/node.pid").exists()
    left = processes_using(home)
    assert left == [], (command_lines(left), log)
    assert proc.returncode == 0 and "Aborted!" not in log, "a Ctrl-C is a clean stop"
    assert log.rstrip().endswith("letsinfer: stopped (Ctrl-C)")


def test_a_restart_of_the_main_refuses_no_client_connection(tmp_path: Path) -> None:
    """Clients keep sending while `service restart` replaces the main's
    process (as upgrade.yml does): each one waits in the gateway socket's
    backlog, which the old process hands to the new, and gets its answer."""
    home = tmp_path / "home"
    port = free_port()
    env = loopback_env(port)
    try:
        started = letsinfer(home, "service", "start", "--json", env=env, timeout=120)
        assert started.returncode == 0, started.stderr
        key = json.loads(started.stdout)["api_key"]
        answers: list[int] = []
        failures: list[str] = []
        done = threading.Event()

        def client() -> None:
            while not done.is_set():
                try:  # a new connection each time, as a script's request is
                    reply = httpx.post(
                        f"http://127.0.0.1:{port}/v1/chat/completions",
                        headers={"Authorization": f"Bearer {key}", "Connection": "close"},
                        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                        timeout=120,
                    )
                    answers.append(reply.status_code)
                except httpx.HTTPError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.1)

        sender = threading.Thread(target=client)
        sender.start()
        try:
            time.sleep(1)
            restarted = letsinfer(home, "service", "restart", env=env, timeout=180)
            assert restarted.returncode == 0, restarted.stderr
            time.sleep(1)
        finally:
            done.set()
            sender.join(timeout=150)
        assert failures == [], failures
        assert answers and set(answers) == {200}, answers
        assert "kept open for the next start" in (home / "var/logs/node.log").read_text()

        letsinfer(home, "service", "stop", env=env, timeout=60)
        with socket.socket() as probe:  # a stop closes the port: nothing keeps it
            assert probe.connect_ex(("127.0.0.1", port)) != 0
        assert processes_using(home) == [], command_lines(processes_using(home))
    finally:
        letsinfer(home, "service", "stop", env=env, timeout=60)


@pytest.mark.parametrize(("job", "kept"), [("restart", True), ("stop", False)])
def test_a_plain_systemctl_restart_keeps_engines_and_a_stop_does_not(
    tmp_path: Path, job: str, kept: bool
) -> None:
    """systemd sends the same SIGTERM for `systemctl restart` and `systemctl
    stop`; the node asks systemd which job it is. systemd does not run here,
    so `systemctl` is a script answering `list-jobs` as systemd does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(
        f'#!/bin/sh\n[ "$1" = list-jobs ] && echo "41 letsinfer.service {job} running"\nexit 0\n'
    )
    systemctl.chmod(0o755)
    systemd = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "INVOCATION_ID": "8f1c6a0e2b7d4c3a9e5f0a1b2c3d4e5f",
        "LETSINFER_SYSTEMD_UNIT": "letsinfer.service",
    }
    home = tmp_path / "home"
    node = start_node(home, env=systemd)
    try:
        [engine] = node.engine_pids()
        node.proc.send_signal(signal.SIGTERM)
        node.proc.wait(timeout=60)
        assert (engine in node.engine_pids()) is kept, node.log()
        if kept:
            again = start_node(home, env=systemd)
            try:
                assert again.engine_pids() == [engine], "the new process adopts the engine"
                reply = again.client(node.key).chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}]
                )
                assert reply.choices[0].message.content == SENTENCE
            finally:
                again.stop()
    finally:
        node.stop()
