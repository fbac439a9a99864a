"""Start the benchmark's servers as child processes on 127.0.0.1 and always stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

from letsinfer.agent import ports


def free_port() -> int:
    """A port for a benchmark's server from its own span: above the engines'
    (20000-29999) and the test suite's (12000-19999), below the kernel's
    ephemeral ports, which any outgoing connection may take between the
    choice and the server's bind."""
    return ports.free_port(span=(30_000, 32_767))


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid,
    pgrp, ...); None for a process gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def group_pids(pgid: int) -> list[str]:
    """The processes of a process group."""
    group = str(pgid)
    pids = []
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields is not None and fields[2] == group:  # pgrp
            pids.append(entry.name)
    return pids


def cpu_seconds(pids: Iterable[int | str]) -> float:
    """User and system CPU time these processes used so far, all their
    threads (a process gone counts nothing)."""
    ticks = 0
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


class Server:
    """A child process serving HTTP, ready once ``ready_path`` answers."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        log_dir: Path,
        *,
        env: dict[str, str] | None = None,
        ready_path: str = "/",
        ready_status: tuple[int, ...] = (200,),
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.log_path = log_dir / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.ready_path = ready_path
        self.ready_status = ready_status
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Server:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,  # its own process group: stopped as one
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                r = httpx.get(self.url + self.ready_path, timeout=2)
                if r.status_code in self.ready_status:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout}s: {self.tail()}")

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """CPU time used so far by the server's processes: every process in
        its group (nginx's workers beside its master)."""
        if self.proc is None:
            return 0.0
        return cpu_seconds(group_pids(os.getpgid(self.proc.pid)))

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()
