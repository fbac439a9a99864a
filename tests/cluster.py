"""A small cluster of real nodes in network namespaces, driven through the CLI."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.netlab import NetLab

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent


class Detached:
    """A node process this test did not start itself (`service restart` did),
    handled like the Popen of one it did."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "X"
        if state in ("Z", "X"):
            self.returncode = 0
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.05)
        return 0


class Cluster:
    def __init__(self, lab: NetLab, root: Path) -> None:
        self.lab = lab
        self.root = root
        self.procs: dict[str, subprocess.Popen[str] | Detached] = {}
        self.extra_env: dict[str, dict[str, str]] = {}
        self.key: str | None = None  # the main's first API key (main_with_children)

    def home(self, name: str) -> Path:
        return self.root / name

    def env(self, name: str) -> dict[str, str]:
        addr = self.lab.hosts[name]
        return {
            "PYTHONUNBUFFERED": "1",
            "LETSINFER_GATEWAY__HOST": addr,
            "LETSINFER_CONTROL__HOST": addr,
            "LETSINFER_AGENT__API_HOST": addr,
            "LETSINFER_CONTROL__HEARTBEAT_INTERVAL_S": "0.5",
            **self.extra_env.get(name, {}),
        }

    def cli(
        self, name: str, *args: str, home: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self.lab.run(
            name,
            PY,
            "-m",
            "letsinfer",
            "--home",
            str(self.home(home or name)),
            *args,
            env=self.env(name),
            timeout=timeout,
        )

    def ok(self, name: str, *args: str, home: str | None = None, timeout: float = 60) -> str:
        result = self.cli(name, *args, home=home, timeout=timeout)
        assert result.returncode == 0, f"{args}: {result.stderr}"
        return result.stdout

    def up(self, name: str, file_limit: tuple[int, int] | None = None) -> None:
        """Start a node; ``file_limit`` (soft, hard) confines its open files."""
        log_path = self.root / f"{name}.log"
        log = log_path.open("w")

        def confine() -> None:
            if file_limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, file_limit)

        proc = self.lab.popen(
            name,
            PY,
            "-m",
            "letsinfer",
            "--home",
            str(self.home(name)),
            "up",
            env=self.env(name),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            preexec_fn=confine,
        )
        assert proc.stdout is not None
        last = "agent plane: listening on"
        for line in proc.stdout:
            if line.startswith("letsinfer main node"):
                last = "gateway: listening on"  # after the control and agent planes
            if line.startswith("Ctrl-C"):
                break
        self.procs[name] = proc
        # The banner comes before the listeners bind: wait for them.
        self.wait(lambda: last in log_path.read_text(), f"{name} listening")

    def wait(self, predicate: object, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            began = time.monotonic()
            if predicate():  # type: ignore[operator]
                return
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-2000:] for p in self.root.glob("*.log")}
                raise AssertionError(f"timed out waiting for {what}; logs: {logs}")
            time.sleep(max(0.2, 2 * (time.monotonic() - began)))

    def restart(self, name: str) -> str:
        """`letsinfer service restart` on a running node; the new process is
        handled as this cluster's from then on."""
        out = self.ok(name, "service", "restart")
        pid = json.loads(self.ok(name, "status", "--json"))["pid"]
        self.procs[name] = Detached(int(pid))
        return out

    def audit(self, name: str) -> list[dict[str, object]]:
        return json.loads(self.ok(name, "audit", "list", "--json"))

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()

    def main_with_children(self, children: tuple[str, ...] = ("n1", "n2")) -> None:
        """Init and start a main and its children, enroll them, wait for their
        facts; the main's first API key lands in ``self.key``."""
        out = self.ok("main", "node", "init", "--main", "--name", "main")
        self.key = out.split("API key (shown once): ")[1].split()[0]
        for n in children:
            self.ok(n, "node", "init", "--name", n)
        for n in ("main", *children):
            self.up(n)
        for n in children:
            self.enroll(n)

        def active() -> set[str]:
            nodes = json.loads(self.ok("main", "node", "list", "--json"))
            return {n["name"] for n in nodes if n["state"] == "active"}

        self.wait(lambda: active() >= set(children), "facts from every child")

    def enroll(self, name: str) -> None:
        """Enroll a running candidate by address and pinned fingerprint."""
        from letsinfer.trust import pki

        cert = pki.load_cert((self.home(name) / "etc/pki/pairing.crt").read_bytes())
        out = self.ok(
            "main",
            "node",
            "add",
            "--address",
            f"{self.lab.hosts[name]}:8444",
            "--fingerprint",
            pki.fingerprint(cert),
        )
        self.ok(name, "node", "accept", out.split("letsinfer node accept ")[1].split()[0])

    def py(self, name: str, script: str, timeout: float = 120) -> str:
        """Run Python inside a host's namespace (clients of its addresses)."""
        result = self.lab.run(name, PY, "-c", script, env=self.env(name), timeout=timeout)
        assert result.returncode == 0, result.stderr
        return result.stdout


def as_node(home: Path) -> str:
    """The start of a test script that speaks as the node at ``home``: ``ctx``
    (its mutual-TLS client context), ``node_id`` and ``key`` (its node key)."""
    return f"""
import json
from pathlib import Path
from letsinfer.trust import pki
from letsinfer.trust.peer import client_context
home = Path("{home}")
d = next((home / "etc/clusters").glob("*"))
ctx = client_context(d / "ca.crt", d / "node.crt", home / "etc/pki/node.key")
node_id = json.loads((home / "etc/node.json").read_text())["node_id"]
key = pki.read_private_key(home / "etc/pki/node.key")
"""


def served_by(c: Cluster, model: str) -> dict[str, int]:
    """Requests for ``model`` answered 200 per group, from the main's access log."""
    counts: dict[str, int] = {}
    for m in re.finditer(
        rf"served={re.escape(model)} pg=(pg-\w+) status=200", (c.root / "main.log").read_text()
    ):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def broken(results: list[dict[str, object]]) -> list[dict[str, object]]:
    """The streamed requests that did not end whole with 200."""
    return [r for r in results if not (r["status"] == 200 and r["whole"])]


@contextlib.contextmanager
def streaming(c: Cluster, model: str, threads: int = 2) -> Iterator[list[dict[str, object]]]:
    """Clients streaming one request after another through the main's gateway
    while the block runs; afterwards the list holds every request's summary."""
    stop = c.root / f"streams-{time.monotonic_ns()}.stop"
    before = sum(served_by(c, model).values())
    client = c.lab.popen(
        "main",
        PY,
        str(ROOT / "tests/load_client.py"),
        "streams",
        f"http://{c.lab.hosts['main']}:8000",
        str(c.key),
        model,
        str(stop),
        str(threads),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    results: list[dict[str, object]] = []
    try:
        c.wait(lambda: sum(served_by(c, model).values()) > before, "streams under way")
        yield results
    finally:
        stop.touch()
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err
        results.extend(json.loads(out))
