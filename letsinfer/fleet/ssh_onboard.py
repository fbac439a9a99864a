"""Onboard one machine over SSH with fabric: the node role's steps, without Ansible.

For ``letsinfer node add --ssh USER@HOST`` (wired into the ``node`` command
group with the trust layer): install letsinfer into its own virtual
environment under ``<root>/releases/<version>`` (from a wheelhouse archive or
the package index), link ``<root>/current``, write ``config.toml`` (checked by
the new release before it replaces the old file), and start the node with
letsinfer's own supervisor. Every step is safe to run twice; a failed step
raises ``OnboardError`` naming it, and what was already in place is left
working (the config is replaced atomically, the release is only linked once
installed).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric import Connection


class OnboardError(Exception):
    """A step failed on the remote machine; the message names the step and its output."""


@dataclass(frozen=True)
class OnboardSettings:
    version: str
    wheelhouse: Path | None = None  # a tar of wheels on this machine
    index_url: str | None = None
    root: str = "/opt/letsinfer"
    python: str = "/usr/bin/python3"
    gateway_host: str = "0.0.0.0"
    gateway_port: int = 8000
    engine_threads: int | None = None
    start: bool = True


@dataclass
class OnboardResult:
    host: str
    version: str
    installed: bool = False  # this call installed the release
    config_changed: bool = False
    started: bool = False
    steps: list[str] = field(default_factory=list)


def connect(
    target: str, *, key_file: str | None = None, proxy_command: str | None = None
) -> Connection:
    """A fabric connection to ``USER@HOST[:PORT]`` with key login only."""
    if "@" not in target:
        raise OnboardError(f"{target!r}: expected USER@HOST[:PORT]")
    connect_kwargs: dict[str, Any] = {"look_for_keys": key_file is None, "allow_agent": False}
    if key_file:
        connect_kwargs["key_filename"] = key_file
    return Connection(target, gateway=proxy_command, connect_kwargs=connect_kwargs)


def render_config(s: OnboardSettings) -> str:
    """config.toml with the gateway's address and port (and engine threads when
    given); everything else keeps letsinfer's defaults, as with the node role's
    default variables."""
    lines = [
        "# written by letsinfer node add --ssh",
        "",
        "[gateway]",
        f'host = "{s.gateway_host}"',
        f"port = {int(s.gateway_port)}",
    ]
    if s.engine_threads:
        lines += ["", "[engine]", f"threads = {int(s.engine_threads)}"]
    return "\n".join(lines) + "\n"


def _run(conn: Connection, command: str, step: str) -> str:
    result = conn.run(command, hide=True, warn=True, in_stream=False)
    if not result.ok:
        out = (result.stderr or result.stdout or "").strip()[-2000:]
        raise OnboardError(f"{conn.host}: {step} failed (exit {result.exited}): {out}")
    return str(result.stdout)


def onboard(
    conn: Connection, settings: OnboardSettings, echo: Callable[[str], None] | None = None
) -> OnboardResult:
    s = settings
    q = shlex.quote
    result = OnboardResult(host=str(conn.host), version=s.version)

    def step(text: str) -> None:
        result.steps.append(text)
        if echo is not None:
            echo(text)

    release = f"{s.root}/releases/{s.version}"
    current = f"{s.root}/current"
    step("check Python")
    _run(
        conn,
        f"{q(s.python)} -c 'import sys; sys.exit(sys.version_info < (3, 11))'",
        f"checking that {s.python} is Python 3.11 or newer",
    )
    _run(conn, f"install -d -m 0755 {q(s.root)} {q(s.root + '/releases')}", "creating directories")

    have = _run(conn, f"test -x {q(release + '/bin/letsinfer')} && echo yes || true", "probe")
    if have.strip() != "yes":
        pip_args = ""
        if s.wheelhouse is not None:
            step("copy the wheelhouse")
            wheels = f"{s.root}/wheelhouse"
            remote_tar = f"{s.root}/wheelhouse.tar"
            _run(conn, f"install -d -m 0755 {q(wheels)}", "creating the wheelhouse directory")
            conn.put(str(s.wheelhouse), remote_tar)
            _run(conn, f"tar -xf {q(remote_tar)} -C {q(wheels)} && rm -f {q(remote_tar)}", "unpack")
            pip_args = f"--no-index --find-links {q(wheels)}"
        elif s.index_url:
            pip_args = f"--index-url {q(s.index_url)}"
        step(f"install letsinfer {s.version}")
        _run(
            conn,
            f"rm -rf {q(release)} && {q(s.python)} -m venv {q(release)} && "
            f"{q(release + '/bin/pip')} install -q --disable-pip-version-check {pip_args} "
            f"{q('letsinfer==' + s.version)}",
            f"installing letsinfer {s.version}",
        )
        result.installed = True
    _run(conn, f"test -e {q(current)} || ln -s {q(release)} {q(current)}", "linking the release")
    letsinfer = f"{current}/bin/letsinfer"

    step("write config.toml")
    etc = "/etc/letsinfer"
    text = render_config(s)
    existing = conn.run(f"cat {etc}/config.toml", hide=True, warn=True, in_stream=False)
    if not existing.ok or existing.stdout != text:
        _run(conn, f"install -d -m 0700 {etc}", "creating /etc/letsinfer")
        tmp = f"{etc}/.config.toml.new"
        _run(
            conn,
            f"umask 077 && printf %s {q(text)} > {tmp} && "
            f"{q(current + '/bin/python')} -m letsinfer.service.checkconfig {tmp} && "
            f"mv {tmp} {etc}/config.toml || {{ rm -f {tmp}; exit 1; }}",
            "checking and writing config.toml",
        )
        result.config_changed = True

    if s.start:
        step("start the node")
        if result.config_changed:
            _run(conn, f"{q(letsinfer)} service stop --json", "stopping the node")
        out = _run(conn, f"{q(letsinfer)} service start --json", "starting the node")
        result.started = bool(json.loads(out).get("started"))
    return result
