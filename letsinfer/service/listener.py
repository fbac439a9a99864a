"""The gateway's listening socket outlives a restart of the main.

A port with no listening socket refuses connections; one whose socket is
open but not accepted from queues them in the kernel. So a restart (``service
restart``, ``systemctl restart``, an upgrade) hands the gateway's socket to a
small keeper process instead of closing it: the old process stops accepting
and drains, the keeper holds the socket (clients wait in its backlog, none is
refused), and the next start takes the socket from the keeper over a unix
socket in the node's run folder (0700: only the node's user can ask) and
accepts what waited. A keeper nobody asks within ``KEEP_S`` closes it and
exits, so a failed start frees the port.

    python -m letsinfer.service.listener --keep PATH --fd N
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from letsinfer.home import Home

log = logging.getLogger("letsinfer.node")

KEEP_S = 120.0  # longer than a start that adopts engines; a failed start frees the port after
_READY_S = 5.0


def keeper_path(home: Home) -> Path:
    return home.run / "gw.sock"


@contextlib.contextmanager
def _reachable(path: Path) -> Iterator[str]:
    """A unix socket's address may be at most 107 bytes: a deep home reaches
    its run folder through a descriptor of it instead (Linux's /proc)."""
    if len(str(path)) < 100:
        yield str(path)
        return
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)


def hand_over(home: Home, sock: socket.socket) -> bool:
    """Give ``sock`` (listening) to a keeper process for the next start; True
    once the keeper holds it. The caller then closes its own copy."""
    path = keeper_path(home)
    path.unlink(missing_ok=True)
    fd = sock.fileno()
    try:
        keeper = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "letsinfer.service.listener",
                "--keep",
                str(path),
                "--fd",
                str(fd),
            ],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the old node's group is not for it
        )
    except OSError as exc:
        log.warning("restarting: the gateway's socket closes (no keeper: %s)", exc)
        return False
    deadline = time.monotonic() + _READY_S
    while time.monotonic() < deadline:
        if path.exists():
            log.info(
                "restarting: the gateway's socket is kept open for the next start "
                "(clients wait, none is refused)"
            )
            return True
        if keeper.poll() is not None:
            break
        time.sleep(0.02)
    with contextlib.suppress(OSError):
        keeper.kill()
    log.warning("restarting: the gateway's socket closes (its keeper did not start)")
    return False


def take(home: Home, host: str, port: int) -> socket.socket | None:
    """The listening socket a previous process of this node kept for
    ``host:port``, or None (no keeper, or it holds another address)."""
    path = keeper_path(home)
    if not path.exists():
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn, _reachable(path) as where:
            conn.settimeout(2.0)
            conn.connect(where)
            _, fds, _, _ = socket.recv_fds(conn, 16, 1)
    except OSError:
        return None
    finally:
        path.unlink(missing_ok=True)
    if not fds:
        return None
    sock = socket.socket(fileno=fds[0])
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        bound = sock.getsockname()
    except OSError:
        sock.close()
        return None
    if not listening or sock.type != socket.SOCK_STREAM or not _same(bound, host, port):
        sock.close()  # the settings changed across the restart: bind afresh
        return None
    return sock


def _same(bound: tuple[str, int] | tuple[str, int, int, int], host: str, port: int) -> bool:
    return bound[1] == port and (
        bound[0] == host or (host in ("", "0.0.0.0") and bound[0] == "0.0.0.0")
    )


def _keep(path: Path, fd: int, wait: float) -> int:
    held = socket.socket(fileno=fd)
    tmp = path.with_name(f".gw.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)
    try:
        with _reachable(tmp) as where:
            server.bind(where)
    finally:
        os.umask(old_mask)
    server.listen(1)
    tmp.replace(path)  # appears only once it accepts: the old node waits for it
    server.settimeout(wait)
    try:
        conn, _ = server.accept()
    except TimeoutError:
        path.unlink(missing_ok=True)  # nobody came: the port closes with this process
        return 1
    finally:
        server.close()
    with conn:
        socket.send_fds(conn, [b"L"], [held.fileno()])
    held.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m letsinfer.service.listener")
    parser.add_argument("--keep", type=Path, required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--wait", type=float, default=KEEP_S)
    args = parser.parse_args(argv)
    return _keep(args.keep, args.fd, args.wait)


if __name__ == "__main__":
    sys.exit(main())
