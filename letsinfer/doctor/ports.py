"""Whether the node's ports are free, or held by the node itself.

Listeners are read from the kernel's socket tables (``/proc/net/tcp*``) and
their owners from ``/proc/<pid>/fd``, so a taken port names the process that
holds it. Standard library only.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from letsinfer.doctor.findings import Finding, fail, ok, warn

_LISTEN = "0A"


@dataclass(frozen=True)
class Port:
    name: str  # "gateway", "control plane", ...
    host: str  # the address it binds ("0.0.0.0": every address)
    port: int
    setting: str  # where it is configured, for the fix


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # /proc/net/tcp6: four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    addr = ipaddress.IPv6Address(words)
    return str(addr.ipv4_mapped or addr)


def _wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def listeners(port: int, host: str, proc: Path = Path("/proc")) -> set[int]:
    """Socket inodes listening on ``port`` at an address that overlaps ``host``."""
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            addr_hex, _, port_hex = fields[1].partition(":")
            if int(port_hex, 16) != port:
                continue
            addr = _address(addr_hex)
            if _wildcard(host) or _wildcard(addr) or addr == host:
                found.add(int(fields[9]))
    return found


def owners(inodes: set[int], proc: Path = Path("/proc")) -> dict[int, str]:
    """pid -> command name of the processes holding these sockets (those we may see)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    found: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    found[int(entry.name)] = (entry / "comm").read_text().strip()
                    break
        except OSError:
            continue
    return found


def descends_from(pid: int, own_pids: set[int], proc: Path = Path("/proc")) -> bool:
    """``pid`` is one of ``own_pids`` or a process they started: a child the
    node has forked (an engine, a command) holds its sockets until it runs
    its own program, and is the node's all the same."""
    for _ in range(64):  # (a bound: a parent loop cannot be, but /proc changes as it is read)
        if pid in own_pids:
            return True
        if pid <= 1:
            return False
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            return False
        pid = int(stat.rpartition(")")[2].split()[1])  # "pid (comm) state ppid ..."
    return False


def _bind_error(host: str, port: int) -> OSError | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or "0.0.0.0", port))
        except OSError as exc:
            return exc
    return None


def check_port(p: Port, own_pids: set[int]) -> Finding:
    """Free, or listened on only by ``own_pids`` (this node's process) and
    the processes it started: ok."""
    check = f"port {p.port}"
    fix = f"stop the process holding it, or move the {p.name} to another port ({p.setting})"
    held = listeners(p.port, p.host)
    if held:
        by = owners(held)
        if by and all(descends_from(pid, own_pids) for pid in by):
            return ok(check, f"{p.name} port {p.port}: in use by this node (pid {min(by)})")
        who = ", ".join(f"{name} (pid {pid})" for pid, name in sorted(by.items()))
        return fail(
            check,
            f"{p.name} port {p.port} on {p.host or '*'} is taken by "
            + (who or "another process (not visible to this user)"),
            fix,
        )
    error = _bind_error(p.host, p.port)
    if error is None:
        return ok(check, f"{p.name} port {p.port} on {p.host or '*'} is free")
    if error.errno == errno.EADDRNOTAVAIL:
        return fail(
            check,
            f"{p.name} binds {p.host}, which is not an address of this machine",
            f"bind it to one of this machine's addresses (the host setting beside {p.setting})",
        )
    if error.errno == errno.EACCES:
        return warn(check, f"{p.name} port {p.port}: {error.strerror} for this user", fix)
    return fail(check, f"{p.name} port {p.port} on {p.host or '*'}: {error.strerror}", fix)
