"""Talking to a node before it trusts us, or we it: certificate pinning.

The main reaches a candidate whose only credential is a self-signed pairing
certificate. The connection is accepted only if that certificate's SHA-256
equals the fingerprint the candidate advertised; the check runs after the TLS
handshake and before a single byte of the request is sent.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import ssl
from typing import Any


class PinMismatch(Exception):
    pass


class PeerUnreachable(Exception):
    pass


def split_address(address: str, default_port: int) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, default_port
    if not port.isdigit():
        raise ValueError(f"invalid address {address!r}: the port must be a number")
    return host.strip("[]"), int(port)


def pinned_request(
    address: str,
    default_port: int,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    fingerprint: str,
    timeout: float = 10.0,
) -> tuple[int, dict[str, Any], bytes]:
    """Returns status, JSON body and the pinned certificate (DER)."""
    host, port = split_address(address, default_port)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the pin below replaces CA verification
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise PeerUnreachable(f"cannot reach {host}:{port}: {exc.strerror or exc}") from exc
    try:
        tls = ctx.wrap_socket(raw)
    except (OSError, ssl.SSLError) as exc:
        raw.close()
        raise PeerUnreachable(f"TLS with {host}:{port} failed: {exc}") from exc
    try:
        der = tls.getpeercert(True) or b""
        actual = hashlib.sha256(der).hexdigest()
        if actual != fingerprint.lower():
            raise PinMismatch(
                f"{host}:{port} presented certificate {actual[:16]}…, not the pinned "
                f"{fingerprint[:16]}…; refused before anything was sent"
            )
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.sock = tls  # the verified socket; HTTPConnection will not reconnect
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=payload, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        try:
            parsed = json.loads(data) if data else {}
        except json.JSONDecodeError:
            parsed = {"error": {"message": data.decode(errors="replace")[:200]}}
        return resp.status, parsed, der
    finally:
        tls.close()
