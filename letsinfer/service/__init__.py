"""letsinfer's own supervisor, for machines where systemd does not run.

``start`` runs ``letsinfer up`` detached from the caller: a new session
(``setsid``), standard input from /dev/null and both outputs appended to
``<var>/logs/node.log``, so an SSH session that starts it returns at once. The
node itself writes and locks ``<run>/node.pid``; a held lock is what
"running" means (a stale file from a killed node does not count). ``stop``
sends SIGTERM (the node stops its engines in order) and SIGKILL after a
grace period. ``restart`` asks the node to leave its engines serving
(service/handover.py), stops it, and starts it again (through systemd when
systemd runs it); the new process adopts the engines.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from letsinfer.home import Home
from letsinfer.service import handover


class ServiceError(Exception):
    """The node could not be started or stopped; the message says why."""


@dataclass(frozen=True)
class ServiceState:
    running: bool
    pid: int | None
    log: Path


def log_file(home: Home) -> Path:
    return home.var / "logs" / "node.log"


def status(home: Home) -> ServiceState:
    pid = home.running_pid()
    return ServiceState(running=pid is not None, pid=pid, log=log_file(home))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _gateway_answers(host: str, port: int) -> bool:
    """Whether a letsinfer gateway answers /health there (200 or 503 both count):
    an open port alone could be another program's."""
    try:
        reply = httpx.get(f"http://{host}:{port}/health", timeout=2)
        return isinstance(reply.json(), dict) and "status" in reply.json()
    except (httpx.HTTPError, ValueError):
        return False


def wait_serving(host: str, port: int, timeout: float) -> bool:
    """Wait until the gateway serves every model meant to serve (its keyless
    /health says "ok"), at most ``timeout`` seconds; whether it does. A model
    that cannot start is parked and stops counting, so this does not wait for
    a broken one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://{host}:{port}/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _agent_answers(host: str, port: int) -> bool:
    """Whether something completes a TLS handshake on the agent port. A candidate
    or child runs only the agent plane (no gateway), so this is its readiness;
    the certificate is not checked here (enrollment pins it)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=2) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


def _probe_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _readiness(
    gateway: tuple[str, int] | None, agent: tuple[str, int] | None
) -> tuple[str, int, Callable[[str, int], bool]]:
    if (gateway is None) == (agent is None):
        raise ValueError("give exactly one of gateway (a main) or agent (a candidate or child)")
    if gateway is not None:
        return _probe_host(gateway[0]), gateway[1], _gateway_answers
    assert agent is not None
    return _probe_host(agent[0]), agent[1], _agent_answers


def start(
    home: Home,
    up_args: Sequence[str],
    *,
    gateway: tuple[str, int] | None = None,
    agent: tuple[str, int] | None = None,
    home_option: str | None = None,
    timeout: float = 60.0,
) -> ServiceState:
    """Start ``letsinfer up`` detached; return once it holds the pid lock and is
    ready for its role: the ``gateway`` answers /health (a main), or, when no
    gateway is given, the ``agent`` port completes a TLS handshake (a candidate
    or child, which run no gateway). Raises ServiceError (with the log's tail)
    if the node exits or does not come up within ``timeout`` seconds."""
    _readiness(gateway, agent)
    current = status(home)
    if current.running:
        return current
    args = ["--home", home_option] if home_option else []
    return _launch(home, [*args, "up", *up_args], gateway, agent, timeout)


def _launch(
    home: Home,
    args: Sequence[str],
    gateway: tuple[str, int] | None,
    agent: tuple[str, int] | None,
    timeout: float,
) -> ServiceState:
    probe, port, ready = _readiness(gateway, agent)
    home.var.mkdir(parents=True, exist_ok=True)
    log = log_file(home)
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "letsinfer", *args]
    offset = log.stat().st_size if log.exists() else 0
    with open(os.devnull, "rb") as devnull, log.open("ab") as out:
        os.chmod(log, 0o640)
        proc = subprocess.Popen(
            argv,
            stdin=devnull,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: not the caller's terminal, not its SSH session
            close_fds=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            raise ServiceError(
                f"letsinfer up exited with status {code}; the end of {log}:\n" + _since(log, offset)
            )
        pid = home.running_pid()
        if pid == proc.pid and ready(probe, port):
            return ServiceState(running=True, pid=pid, log=log)
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise ServiceError(
                f"letsinfer up did not answer on {probe}:{port} within {timeout:.0f}s; "
                f"the end of {log}:\n" + _since(log, offset)
            )
        time.sleep(0.1)


def _since(log: Path, offset: int) -> str:
    try:
        with log.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-15:])


def stop(home: Home, timeout: float = 30.0) -> bool:
    """Stop the running node; True if one was running. SIGKILL after ``timeout``."""
    pid = home.running_pid()
    if pid is None:
        return False
    if pid <= 0:
        raise ServiceError(f"{home.pid_file} is locked but holds no pid; stop that process by hand")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while home.running_pid() is not None:
        if time.monotonic() > deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            _wait_gone(pid, 10)
            break
        time.sleep(0.1)
    return True


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@dataclass(frozen=True)
class Restarted:
    old_pid: int | None  # None: it was not running, so this started it
    state: ServiceState
    via: str  # "letsinfer" (its own supervisor) or "systemd:<unit>"
    engines: int  # engines that ran before and still run, adopted by the new process
    replaced: int  # engines that ran before and did not survive the restart


def _letsinfer_args(pid: int) -> list[str] | None:
    """The arguments a running node was started with, after the program itself
    (``python -m letsinfer ARGS`` or ``.../bin/letsinfer ARGS``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return None
    words = [a.decode(errors="replace") for a in argv]
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words) and words[i + 1] == "letsinfer":
            return words[i + 2 :]
        if i and Path(word).name == "letsinfer":  # a console script, run by its Python
            return words[i + 1 :]
    return None


def systemd_unit(pid: int) -> str | None:
    """The systemd service whose main process is ``pid``, or None. Its cgroup
    names the candidate; systemd must confirm the pid is that unit's own main
    process (a node started by hand inside some other service is not it)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    unit = next(
        (n for n in (ln.rsplit("/", 1)[-1] for ln in lines) if n.endswith(".service")), None
    )
    if unit is None:
        return None
    try:
        main = subprocess.run(
            ["systemctl", "show", "--property=MainPID", "--value", unit],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return unit if main == str(pid) else None


def _live_engines(home: Home) -> set[tuple[str, int]]:
    from letsinfer.agent import reattach

    return set(reattach.running(home.engine_run))


def restart(
    home: Home,
    *,
    gateway: tuple[str, int] | None = None,
    agent: tuple[str, int] | None = None,
    home_option: str | None = None,
    unit: str | None = None,
    stop_timeout: float = 60.0,
    timeout: float = 60.0,
) -> Restarted:
    """Restart the node so that its ready engines keep serving: the running
    process is asked to hand them over, stopped (``stop_timeout``, then
    SIGKILL: its engines still wait for the new process), and started again
    with the arguments it had, by this Python (a new release's, after an
    upgrade). Through ``unit`` (or the systemd service found running it) it is
    ``systemctl restart``. A node that was not running is started."""
    probe, port, ready = _readiness(gateway, agent)
    pid = home.running_pid()
    if pid is not None and pid <= 0:
        raise ServiceError(f"{home.pid_file} is locked but holds no pid; stop that process by hand")
    unit = unit or (systemd_unit(pid) if pid else None)
    before = _live_engines(home)
    if pid is not None:
        handover.request(home, pid)
    if unit is not None:
        done = subprocess.run(
            ["systemctl", "restart", unit], capture_output=True, text=True, timeout=stop_timeout
        )
        if done.returncode != 0:
            handover.cancel(home)
            raise ServiceError(f"systemctl restart {unit} failed: {done.stderr.strip()}")
        state = _wait_running(home, pid, probe, port, ready, timeout)
        via = f"systemd:{unit}"
    else:
        args = _letsinfer_args(pid) if pid else None
        if args is None:
            args = [*(["--home", home_option] if home_option else []), "up"]
        if pid is not None:
            stop(home, stop_timeout)
        state = _launch(home, args, gateway, agent, timeout)
        via = "letsinfer"
    handover.cancel(home)  # a request the old process never took must not outlive it
    after = _live_engines(home)
    return Restarted(pid, state, via, len(before & after), len(before - after))


def _wait_running(
    home: Home,
    old: int | None,
    probe: str,
    port: int,
    ready: Callable[[str, int], bool],
    timeout: float,
) -> ServiceState:
    deadline = time.monotonic() + timeout
    while True:
        pid = home.running_pid()
        if pid is not None and pid != old and ready(probe, port):
            return ServiceState(running=True, pid=pid, log=log_file(home))
        if time.monotonic() > deadline:
            raise ServiceError(f"the node did not answer on {probe}:{port} within {timeout:.0f}s")
        time.sleep(0.1)
