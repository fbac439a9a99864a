"""How far this machine's clock is from a reference, behind one seam.

A skewed clock silently breaks a cluster: the main refuses facts more than
30 s from its own clock, so a child drifting that far goes stale for no
visible reason. The reference is the main when there is one (its control
plane's ``/v1/time``, or any HTTP answer's ``Date`` header), else an NTP
server. ``SntpSource`` and ``HttpTimeSource`` are the real sources;
``FixedOffset`` is the fake for tests. Standard library only.
"""

from __future__ import annotations

import email.utils
import json
import os
import socket
import ssl
import struct
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Protocol

from letsinfer.doctor.findings import Finding, fail, ok, warn

# Thresholds, in seconds. The main refuses facts 30 s off; a third of that
# fails, so a drifting clock is named well before facts are refused.
WARN_S = 2.0
FAIL_S = 10.0

_NTP_EPOCH = 2208988800  # seconds from 1900-01-01 to 1970-01-01


class ClockError(Exception):
    """The reference could not be asked, or its answer makes no sense."""


@dataclass(frozen=True)
class Measurement:
    offset_s: float  # reference minus this machine: positive when we are behind
    error_s: float  # how far off the measurement itself may be
    source: str


class TimeSource(Protocol):
    name: str

    def measure(self) -> Measurement: ...


@dataclass
class FixedOffset:
    """The fake: a reference that is always ``offset_s`` from this clock."""

    offset_s: float
    name: str = "fixed reference"

    def measure(self) -> Measurement:
        return Measurement(self.offset_s, 0.0, self.name)


def _ntp_time(data: bytes) -> float:
    seconds, fraction = struct.unpack("!II", data)
    return seconds - _NTP_EPOCH + fraction / 2**32


def _ntp_bytes(t: float) -> bytes:
    seconds = int(t) + _NTP_EPOCH
    return struct.pack("!II", seconds & 0xFFFFFFFF, int((t % 1) * 2**32) & 0xFFFFFFFF)


@dataclass
class SntpSource:
    """One SNTP exchange (RFC 4330) with ``host``: offset from the four timestamps."""

    host: str
    port: int = 123
    timeout_s: float = 2.0

    @property
    def name(self) -> str:
        return f"NTP server {self.host}:{self.port}"

    def measure(self) -> Measurement:
        # Our transmit time goes out in the transmit field; a real answer
        # echoes it as its originate time (a stray or forged packet does not).
        sent = time.time()
        nonce = _ntp_bytes(sent)[:4] + os.urandom(4)
        request = b"\x23" + b"\x00" * 39 + nonce  # LI 0, version 4, mode 3 (client)
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_DGRAM)
        except OSError as exc:
            raise ClockError(f"cannot resolve {self.host}: {exc}") from exc
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(self.timeout_s)
            try:
                t1 = time.time()
                sock.sendto(request, address)
                deadline = time.monotonic() + self.timeout_s
                while True:
                    data, _ = sock.recvfrom(512)
                    t4 = time.time()
                    if len(data) >= 48 and data[24:32] == nonce:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError
            except TimeoutError as exc:
                raise ClockError(f"no answer within {self.timeout_s:g}s") from exc
            except OSError as exc:
                raise ClockError(str(exc)) from exc
        mode, stratum = data[0] & 0x7, data[1]
        if mode != 4 or stratum == 0:
            raise ClockError(f"not a usable NTP answer (mode {mode}, stratum {stratum})")
        t2, t3 = _ntp_time(data[32:40]), _ntp_time(data[40:48])
        offset = ((t2 - t1) + (t3 - t4)) / 2
        delay = max(0.0, (t4 - t1) - (t3 - t2))
        return Measurement(offset, delay / 2, self.name)


@dataclass
class HttpTimeSource:
    """A GET to ``url``: its JSON ``time`` (the control plane's ``/v1/time``)
    when it has one, else its ``Date`` header (whole seconds)."""

    url: str
    context: ssl.SSLContext | None = None
    timeout_s: float = 5.0
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.url

    def measure(self) -> Measurement:
        request = urllib.request.Request(self.url, headers={"accept": "application/json"})
        t1 = time.time()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.context) as r:
                body, date = r.read(4096), r.headers.get("date")
        except urllib.error.HTTPError as exc:  # an error answer still carries its Date
            body, date = b"", exc.headers.get("date")
        except (OSError, ValueError) as exc:
            raise ClockError(str(getattr(exc, "reason", exc))) from exc
        t4 = time.time()
        half_trip = (t4 - t1) / 2
        try:
            precise = float(json.loads(body)["time"])
        except (ValueError, KeyError, TypeError):
            precise = None
        if precise is not None:
            return Measurement(precise - (t1 + half_trip), half_trip, self.name)
        if not date:
            raise ClockError("the answer carries neither a time nor a Date header")
        try:
            stamp = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError) as exc:
            raise ClockError(f"unreadable Date header {date!r}") from exc
        # A Date header is the server's time cut to the second: +0.5 s on average.
        return Measurement(stamp + 0.5 - (t1 + half_trip), 0.5 + half_trip, self.name)


def parse_ntp(value: str) -> SntpSource:
    """``HOST`` or ``HOST:PORT`` (``[v6]:PORT`` for IPv6)."""
    host, port = value, 123
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif value.count(":") == 1:
        host, _, p = value.partition(":")
        port = int(p)
    return SntpSource(host, port)


NO_REFERENCE = "no main to compare with and no NTP server given"
MAIN_NO_REFERENCE = "this is the main (its children's reference) and no NTP server was given"


def check_clock(sources: list[TimeSource], none_given: str = NO_REFERENCE) -> Finding:
    """The first source that answers decides; none answering is a warning
    (the clock is not known to be wrong, only not checked)."""
    if not sources:
        return warn(
            "clock",
            f"not checked: {none_given}",
            "pass --ntp HOST (the site's NTP server)",
        )
    tried = []
    for source in sources:
        try:
            m = source.measure()
        except ClockError as exc:
            tried.append(f"{source.name}: {exc}")
            continue
        return clock_finding(m)
    return warn(
        "clock",
        "not checked: " + "; ".join(tried),
        "make the reference reachable, or pass --ntp HOST (the site's NTP server)",
    )


def clock_finding(m: Measurement) -> Finding:
    off = abs(m.offset_s) - m.error_s  # the least the clock can be off
    side = "behind" if m.offset_s > 0 else "ahead of"
    said = f"{abs(m.offset_s):.1f}s {side} {m.source} (±{m.error_s:.1f}s)"
    fix = "synchronise the clock (chrony or systemd-timesyncd against the site's NTP server)"
    if off > FAIL_S:
        return fail(
            "clock",
            f"{said}: the main refuses facts more than 30s off, certificates may look "
            "not yet valid",
            fix,
        )
    if off > WARN_S:
        return warn("clock", said, fix)
    return ok("clock", said)
