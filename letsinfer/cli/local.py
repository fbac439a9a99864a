"""How the CLI talks to the node running on this machine: its admin socket.

When no node runs on this home (no socket, or nobody listening on it), the
callers fall back to working on the home's files directly; a socket the user
may not open is an error, never a silent fallback.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import quote

import click
import httpx

from letsinfer.home import Home


def segment(value: str) -> str:
    """One URL path segment (a model or node name)."""
    return quote(value, safe="")


def ask_node(
    home: Home, method: str, path: str, json: Any = None, timeout: float | None = 60
) -> dict[str, Any] | None:
    """The running node's answer, or None when no node runs on this home.
    ``timeout`` None: wait as long as the operation takes (rollouts)."""
    path_ = home.admin_socket
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path_))
    except PermissionError as exc:
        raise click.ClickException(
            f"permission denied on the admin socket {path_}: it admits root, the node's "
            "user and members of the 'letsinfer' group"
        ) from exc
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    finally:
        probe.close()
    transport = httpx.HTTPTransport(uds=str(path_))
    with httpx.Client(transport=transport, base_url="http://node", timeout=timeout) as client:
        try:
            resp = client.request(method, path, json=json)
        except httpx.HTTPError as exc:
            raise click.ClickException(f"the node on {path_} did not answer: {exc}") from exc
    try:
        body = resp.json()
    except ValueError:
        body = {"error": {"message": resp.text}}
    if resp.status_code >= 400:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        raise click.ClickException(str(err.get("message") or resp.text))
    return body  # type: ignore[no-any-return]


def node_runs_here(home: Home) -> bool:
    """Whether a node process holds this home's pid-file lock (see `up`)."""
    import fcntl

    try:
        fh = home.pid_file.open("r")
    except FileNotFoundError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False
