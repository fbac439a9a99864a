"""The local admin plane: a unix socket under the node's run directory, through
which the `letsinfer` CLI on the machine talks to its own running node.

Who may connect is decided twice: the socket file is ``0660`` (owner and the
``letsinfer`` group), and every connection's peer credentials (``SO_PEERCRED``:
the connecting process's pid, uid and gid, from the kernel) are checked before
any route runs: root, the node's own user, or a member of the ``letsinfer``
group. Admitted callers act as a local administrator; refusals are audited
(counted per caller and reason, see letsinfer.audit.denials).
The CLI needs no key material for this: the node process holds its keys.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import grp
import os
import pwd
import socket
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from letsinfer.audit.denials import DenialLog
from letsinfer.connections import PLANE_LIMITS, Tally, guarded
from letsinfer.home import ADMIN_GROUP
from letsinfer.planes import EmbeddedServer, RunningPlane
from letsinfer.trust.peer import Peer, Scope, refuse
from letsinfer.trust.pki import CertIdentity

ASGIApp = Callable[[Scope, Any, Any], Any]


@dataclass(frozen=True)
class Credentials:
    pid: int
    uid: int
    gid: int

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return f"uid{self.uid}"


def credentials_of(sock: socket.socket) -> Credentials:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Credentials(pid, uid, gid)


def _groups_of(creds: Credentials) -> set[int]:
    """The caller's groups: from the kernel's view of the process when we can
    see it (supplementary groups included), else from the user database."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{creds.pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]} | {creds.gid}
    try:
        return set(os.getgrouplist(pwd.getpwuid(creds.uid).pw_name, creds.gid))
    except KeyError:
        return {creds.gid}


def refusal(creds: Credentials, node_uid: int, group: str = ADMIN_GROUP) -> str | None:
    """Why this caller may not administer the node, or None when it may."""
    if creds.uid in (0, node_uid):
        return None
    with contextlib.suppress(KeyError):
        if grp.getgrnam(group).gr_gid in _groups_of(creds):
            return None
    return f"user {creds.user} is not root, the node's user, or in the {group!r} group"


class CredentialsProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus the kernel's peer credentials in scope."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        creds = credentials_of(sock) if sock is not None else None
        app = self.app

        async def wrapped(scope: Scope, receive: Any, send: Any) -> None:
            scope.setdefault("extensions", {})["peer_credentials"] = creds
            await app(scope, receive, send)

        self.app = wrapped


def local_peer(creds: Credentials) -> Peer:
    ident = CertIdentity(
        kind="local",
        id=creds.user,
        role="administrator",
        fingerprint="",
        serial=0,
        not_after=dt.datetime.max.replace(tzinfo=dt.UTC),
    )
    return Peer(identity=ident, address=None)


class LocalGate:
    """Admit only callers whose credentials pass :func:`refusal`; count the rest
    into the audit chain (aggregated per caller and reason)."""

    def __init__(self, app: ASGIApp, denials: DenialLog, node_uid: int) -> None:
        self.app = app
        self.denials = denials
        self.node_uid = node_uid

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        creds: Credentials | None = scope.get("extensions", {}).get("peer_credentials")
        reason = "no peer credentials" if creds is None else refusal(creds, self.node_uid)
        if reason is None and creds is not None:
            scope.setdefault("state", {})["peer"] = local_peer(creds)
            await self.app(scope, receive, send)
            return
        who = f"local:{creds.user}" if creds else "local:unknown"
        self.denials.note(who, "admin:request", reason)
        await refuse(send, reason, "local_refused")


def bind_admin_socket(path: Path, group: str = ADMIN_GROUP) -> socket.socket:
    """Listen on ``path`` with mode 0660 from the first instant (umask, not a
    later chmod), group ``letsinfer`` where that group exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise RuntimeError(f"{path} exists and is not a socket; refusing to replace it")
        path.unlink()  # a stale socket from a node that did not stop cleanly
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    with contextlib.suppress(KeyError, PermissionError):
        os.chown(path, -1, grp.getgrnam(group).gr_gid)
    sock.listen(64)
    return sock


class AdminPlane(RunningPlane):
    """The admin socket's server; the socket file goes away when it stops."""

    def __init__(self, path: Path, app: ASGIApp) -> None:
        sock = bind_admin_socket(path)
        self.path = path
        self.inode = path.stat().st_ino
        super().__init__(_admin_server(app), sockets=[sock])

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_ino == self.inode:  # not a newer node's socket
                self.path.unlink()


def _admin_server(app: ASGIApp) -> uvicorn.Server:
    # Local callers only (the socket's mode), so no cap; a stuck one still
    # must not hold a connection for ever.
    late = Tally(
        "admin socket: closed %d connection(s) that sent no complete request headers "
        f"within {PLANE_LIMITS.header_timeout_s:g}s (last: %s)"
    )
    config = uvicorn.Config(
        app,
        http=guarded(CredentialsProtocol, PLANE_LIMITS.header_timeout_s, late.note),
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return EmbeddedServer(config)
