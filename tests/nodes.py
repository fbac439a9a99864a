"""Start real nodes (the real CLI, as subprocesses) for tests, and clean up after them."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from letsinfer.agent.ports import bindable

# Ports for servers a test starts come from below the kernel's ephemeral range
# (32768 and up by default) and below the engines' and parallel tasks' own
# (20000-29999), from a span of this pytest-xdist worker's own, handed out in
# turn: between a port's choice and the server's bind, no outgoing connection,
# no engine a node starts, no other worker and no later choice here can take it.
# (A worker replacing a crashed one is numbered past the count: it takes the
# span of the one it replaces. Each run starts at a random point of its span,
# so two runs on one machine do not walk the same ports in step.)
_PORTS_FIRST, _PORTS_END = 12_000, 20_000
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
_PORTS_PER_WORKER = (_PORTS_END - _PORTS_FIRST) // _workers
_ports_start = _PORTS_FIRST + (int(_worker) % _workers if _worker.isdigit() else 0) * (
    _PORTS_PER_WORKER
)
_next_port = itertools.count(random.randrange(_PORTS_PER_WORKER))


def free_port() -> int:
    for _ in range(_PORTS_PER_WORKER):
        port = _ports_start + next(_next_port) % _PORTS_PER_WORKER
        if bindable("127.0.0.1", port):
            return port
    raise OSError(f"no free port in {_ports_start}-{_ports_start + _PORTS_PER_WORKER - 1}")


def loopback_env(gateway_port: int) -> dict[str, str]:
    """A node on this machine for a test: every plane on loopback with its own
    port, and no mDNS on the machine's real links."""
    return {
        "LETSINFER_GATEWAY__HOST": "127.0.0.1",
        "LETSINFER_GATEWAY__PORT": str(gateway_port),
        "LETSINFER_CONTROL__HOST": "127.0.0.1",
        "LETSINFER_CONTROL__PORT": str(free_port()),
        "LETSINFER_AGENT__API_HOST": "127.0.0.1",
        "LETSINFER_AGENT__API_PORT": str(free_port()),
        "LETSINFER_GATEWAY__METRICS_PORT": "0",
        "LETSINFER_DISCOVERY__ENABLED": "false",
    }


def processes_using(path: Path) -> list[int]:
    """PIDs whose command line mentions ``path`` (engines carry their model path)."""
    needle = str(path).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def command_lines(pids: list[int]) -> list[str]:
    """What each of ``pids`` runs, for a failed assertion's message."""
    lines = []
    for pid in pids:
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            lines.append(f"{pid}: gone")
    return lines


def letsinfer(
    home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "letsinfer", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@dataclass
class RunningNode:
    home: Path
    port: int
    proc: subprocess.Popen[str]
    banner: list[str]
    log_path: Path
    key: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # Engines still running when the node process had exited (see stop()).
    outlived: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, key: str | None = None, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key=key or self.key or "none", max_retries=0, **kwargs
        )  # type: ignore[arg-type]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return letsinfer(self.home, *args, env=self.env)

    def engine_pids(self) -> list[int]:
        return processes_using(self.home / "var" / "models")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, timeout: float = 90, degraded: bool = False) -> dict[str, object]:
        """/health until 200 (or, with ``degraded``, until it answers at all: a
        model of the node is meant not to serve); with the node's key, so its
        models are listed."""
        deadline = time.monotonic() + timeout
        last: object = None
        auth = {"authorization": f"Bearer {self.key}"} if self.key else {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"node exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(self.url + "/health", headers=auth, timeout=2)
                last = r.text
                if r.status_code == 200 or (degraded and r.status_code == 503):
                    return r.json()
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.1)
        raise AssertionError(f"node not healthy after {timeout}s (last: {last}):\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.outlived = self.engine_pids()
        for pid in self.outlived:  # never leave engines behind, even on failure
            os.kill(pid, signal.SIGKILL)
        return self.proc.returncode


def start_node(
    home: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    timeout: float = 90,
    degraded: bool = False,
) -> RunningNode:
    port = free_port()
    log_path = home.parent / f"{home.name}.log"
    env = {"PYTHONUNBUFFERED": "1", **loopback_env(port), **(env or {})}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "letsinfer",
            "--home",
            str(home),
            "up",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=log_path.open("w"),
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env},
    )
    node = RunningNode(home=home, port=port, proc=proc, banner=[], log_path=log_path, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        node.banner.append(line.rstrip("\n"))
        if line.strip().startswith("API key"):
            node.key = line.split()[2]
        if line.startswith("Ctrl-C"):
            break
    else:
        node.stop()
        raise AssertionError(f"node printed no banner:\n{node.log()}")
    try:
        node.wait_healthy(timeout, degraded)
    except AssertionError:
        node.stop()
        raise
    return node
