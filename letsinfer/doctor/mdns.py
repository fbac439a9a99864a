"""Whether mDNS works here: join 224.0.0.251:5353 and hear our own query.

Discovery is optional (``node add --address`` needs none), so a failure here
warns. Standard library only.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from letsinfer.doctor.findings import Finding, ok, warn

GROUP, PORT = "224.0.0.251", 5353
SERVICE = "_letsinfer._tcp.local"


def _query(ident: int) -> bytes:
    header = struct.pack("!HHHHHH", ident, 0, 1, 0, 0, 0)
    name = b"".join(bytes([len(p)]) + p.encode() for p in SERVICE.split(".")) + b"\x00"
    return header + name + struct.pack("!HH", 12, 1)  # PTR, IN


def check_mdns(enabled: bool, timeout_s: float = 1.0) -> Finding:
    if not enabled:
        return ok("mdns", "discovery is off ([discovery] enabled = false)")
    fix = "allow multicast UDP 5353 on the LAN interface, or enroll nodes by address"
    ident = int.from_bytes(os.urandom(2), "big")
    query = _query(ident)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):  # beside a running node's responder
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("", PORT))
            membership = socket.inet_aton(GROUP) + socket.inet_aton("0.0.0.0")
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            s.settimeout(timeout_s)
            s.sendto(query, (GROUP, PORT))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                data, _ = s.recvfrom(9000)
                if data == query:
                    return ok("mdns", f"multicast {GROUP}:{PORT} joined, a query sent and heard")
    except TimeoutError:
        pass
    except OSError as exc:
        return warn("mdns", f"multicast {GROUP}:{PORT} unusable: {exc.strerror or exc}", fix)
    return warn("mdns", f"a query sent to {GROUP}:{PORT} was not heard back", fix)
