"""An attacker holding connections open against a server, for tests (run
several for more connections than one process may open).

``python tests/flood_client.py HOST PORT IDLE SLOW WAIT_S`` opens SLOW
slowloris connections (half send a request's headers a byte at a time, never
finished; half send an inference POST's headers whole, with no key, then its
small body a byte at a time), then IDLE connections that send nothing (non-blocking: thousands in
well under a second), prints ``ready``, keeps trickling header bytes, and
after at most WAIT_S seconds prints a JSON line: how many slowloris
connections the server closed, and after how many seconds the first and last.
"""

from __future__ import annotations

import json
import resource
import select
import socket
import sys
import time

HEADERS = b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\nX-Pad: "
BODY = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
    b"Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n{"
)


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    idle_n, slow_n, wait_s = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    need = idle_n + slow_n + 256
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        sys.exit(f"needs {need} open files, the hard limit is {hard}: run more clients")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))

    slow: list[socket.socket] = []
    for n in range(slow_n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(HEADERS if n % 2 else BODY)
        s.setblocking(False)
        slow.append(s)
    idle: list[socket.socket] = []
    for _ in range(idle_n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, port))  # EINPROGRESS: the kernel finishes it
        idle.append(s)
    started = time.monotonic()
    print("ready", flush=True)

    open_ = {s.fileno(): s for s in slow}
    closed_at: list[float] = []
    next_byte = 0.0
    while open_ and time.monotonic() - started < wait_s:
        readable, _, _ = select.select(list(open_.values()), [], [], 0.2)
        gone = []
        for s in readable:
            try:
                if s.recv(4096) == b"":
                    gone.append(s)
            except OSError:
                gone.append(s)
        if time.monotonic() >= next_byte:  # one more header byte each
            next_byte = time.monotonic() + 0.5
            for s in open_.values():
                try:
                    s.send(b"a")
                except OSError:
                    gone.append(s)
        for s in set(gone):
            if open_.pop(s.fileno(), None) is not None:
                closed_at.append(time.monotonic() - started)
                s.close()
    print(
        json.dumps(
            {
                "slow": slow_n,
                "slow_closed": len(closed_at),
                "first_closed_s": min(closed_at, default=None),
                "last_closed_s": max(closed_at, default=None),
            }
        ),
        flush=True,
    )
    for s in idle + list(open_.values()):
        s.close()


if __name__ == "__main__":
    main()
