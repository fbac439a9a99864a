"""A real SNTP server on loopback whose clock is ``skew_s`` off: the reference
that ``letsinfer doctor --ntp`` asks in tests, through the same client code
as against a site's NTP server."""

from __future__ import annotations

import socket
import struct
import threading
import time
from types import TracebackType

_NTP_EPOCH = 2208988800


def _stamp(t: float) -> bytes:
    return struct.pack("!II", int(t) + _NTP_EPOCH, int((t % 1) * 2**32))


class SkewedNtpServer:
    def __init__(self, skew_s: float = 0.0, host: str = "127.0.0.1") -> None:
        self.skew_s = skew_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.2)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(512)
            except TimeoutError:
                continue
            if len(data) < 48:
                continue
            now = time.time() + self.skew_s
            reply = (
                bytes([0x24, 2, 6, 0xEC])  # LI 0, version 4, mode 4 (server); stratum 2
                + b"\x00" * 8  # root delay, root dispersion
                + b"TEST"  # reference id
                + _stamp(now - 60)  # reference time
                + data[40:48]  # originate: the client's transmit time, echoed
                + _stamp(now)  # receive
                + _stamp(time.time() + self.skew_s)  # transmit
            )
            self.sock.sendto(reply, peer)

    def __enter__(self) -> SkewedNtpServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()
