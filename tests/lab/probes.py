"""An outsider's view of a lab host: which of its protected ports listen, and
which of them a connection from here reaches (tests of the firewall's promise
that non-members reach no control, agent or engine port)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import selectors
import socket
import time
from pathlib import Path


def protected(port: int) -> bool:
    """Ports only members (or the main) may reach: control, agent, metrics,
    parallel tasks and engines (letsinfer's defaults)."""
    return port in (8443, 8444, 9400) or 20000 <= port <= 29999


def listening_ports(pid: int) -> set[int]:
    """TCP ports something listens on in ``pid``'s network namespace, any address."""
    ports = set()
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def connects(targets: list[tuple[str, int]], timeout: float = 1.0) -> set[tuple[str, int]]:
    """Which targets accept a TCP connection (tried all at once)."""
    sel = selectors.DefaultSelector()
    socks, accepted = [], set()
    for target in targets:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        if s.connect_ex(target) in (0, errno.EINPROGRESS):
            sel.register(s, selectors.EVENT_WRITE, target)
        socks.append(s)
    deadline = time.monotonic() + timeout
    try:
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                sel.unregister(key.fileobj)
                if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:  # type: ignore[union-attr]
                    accepted.add(key.data)
    finally:
        sel.close()
        for s in socks:
            s.close()
    return accepted


def enter_network_namespace(ns: str) -> None:
    """Move the calling thread (only it) into network namespace ``ns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(fd)
