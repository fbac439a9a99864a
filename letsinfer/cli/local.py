"""How the CLI talks to the node running on this machine: its admin socket.

When no node runs on this home (no socket, or nobody listening on it), the
callers fall back to working on the home's files directly; a socket the user
may not open is an error, never a silent fallback.

Plain HTTP/1.1 over the unix socket with the standard library: one request
per CLI call does not need an HTTP client library's import time.
"""

from __future__ import annotations

import http.client
import json as jsonlib
import socket
from typing import Any
from urllib.parse import quote

import click

from letsinfer.home import ADMIN_GROUP, Home


def segment(value: str) -> str:
    """One URL path segment (a model or node name)."""
    return quote(value, safe="")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("node", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def ask_node(
    home: Home, method: str, path: str, json: Any = None, timeout: float | None = 60
) -> dict[str, Any] | None:
    """The running node's answer, or None when no node runs on this home.
    ``timeout`` None: wait as long as the operation takes (rollouts)."""
    where = str(home.admin_socket)
    conn = _UnixConnection(where, timeout)
    try:
        conn.connect()
    except PermissionError as exc:
        conn.close()
        raise click.ClickException(
            f"permission denied on the admin socket {where}: it admits root, the node's "
            f"user and members of the {ADMIN_GROUP!r} group"
        ) from exc
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        conn.close()
        return None
    body = None if json is None else jsonlib.dumps(json).encode()
    headers = {"content-type": "application/json"} if body is not None else {}
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise click.ClickException(f"the node on {where} did not answer: {exc}") from exc
    finally:
        conn.close()
    text = raw.decode(errors="replace")
    try:
        answer = jsonlib.loads(text)
    except ValueError:
        answer = {"error": {"message": text}}
    if resp.status >= 400:
        err = answer.get("error", {}) if isinstance(answer, dict) else {}
        if not isinstance(err, dict):
            err = {}
        message = err.get("message") or (answer.get("detail") if isinstance(answer, dict) else None)
        raise click.ClickException(str(message or text))
    return answer  # type: ignore[no-any-return]


def node_runs_here(home: Home) -> bool:
    """Whether a node process holds this home's pid-file lock (see `up`)."""
    return home.running_pid() is not None
