"""Free TCP ports for engines."""

from __future__ import annotations

import random
import socket


def bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1", span: tuple[int, int] | None = None) -> int:
    """A port nothing listens on: any (the kernel's choice) or one inside ``span``
    (first, last), so a firewall can name the ports engines use. Starts at a
    random point of the span so restarts do not race for the same port."""
    if span is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    first, last = span
    ports = list(range(first, last + 1))
    start = random.randrange(len(ports))
    for port in ports[start:] + ports[:start]:
        if bindable(host, port):
            return port
    raise OSError(f"no free port for an engine in {first}-{last} on {host}")
