"""TLS handshakes the planes run themselves, so that a refused one is audited.

With ``ssl=`` on a server, the event loop performs the handshake and a
failure never reaches the application: a certificate from another cluster's
CA would be refused without a trace. Instead :class:`TlsListener` accepts on
a plain socket (within the plane's connection limits, as every listener
does) and hands each connection to ``connect_accepted_socket`` with
the plane's TLS context, which raises when the handshake fails; the HTTP
protocol (uvicorn's, via ``PeerCertProtocol``) only ever sees established TLS.
(``start_tls`` on an accepted plain transport is not an option: uvloop may
deliver the ClientHello to the plain protocol before it can pause reading.)
A handshake refused over a certificate is reported to ``on_refused`` (which
counts it, see letsinfer.audit.denials); scans, resets and timeouts are
not (they say nothing about trust).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable

from letsinfer.connections import ConnectionLimits, Listener, ProtocolFactory
from letsinfer.trust.peer import Presenting

HANDSHAKE_TIMEOUT_S = 10.0
# Alerts a client sends when it refuses *our* certificate (it trusts another CA).
_CLIENT_REFUSED = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)


def refusal_reason(exc: BaseException) -> str | None:
    """What a failed handshake says about trust, or None when it says nothing."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"client certificate not accepted by this cluster's CA: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError) and exc.reason in _CLIENT_REFUSED:
        return f"the client refused this node's certificate ({exc.reason})"
    return None


class TlsListener(Listener):
    """A :class:`Listener` that runs each TLS handshake with
    ``connect_accepted_socket``, which raises when the handshake fails; only
    then is ``protocol()`` (uvicorn's HTTP protocol) attached to the connection.
    No byte is read outside TLS, on asyncio or uvloop alike. A connection in
    its handshake holds a slot like any other. Each handshake uses the
    context ``tls`` presents at that moment (a renewal swaps it)."""

    # How long closing a connection waits for the client's close_notify
    # (None: the loop's default, 30 s; an idle client holds a stop that long).
    ssl_shutdown_timeout_s: float | None = None

    def __init__(
        self,
        sock: socket.socket,
        limits: ConnectionLimits,
        protocol: ProtocolFactory,
        tls: Presenting,
        on_refused: Callable[[str, str], None] | None,
        *,
        name: str,
    ) -> None:
        super().__init__(sock, limits, protocol, name=name)
        self.tls = tls
        self.on_refused = on_refused
        self.handshakes = 0  # completed
        self.resumed = 0  # of them, a resumed TLS session (no certificate work)

    async def _connect(self, conn: socket.socket, address: str, factory: ProtocolFactory) -> bool:
        loop = asyncio.get_running_loop()
        try:
            # On failure the loop closes the connection (and the socket) itself.
            transport, _ = await loop.connect_accepted_socket(
                factory,
                conn,
                ssl=self.tls.context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
                ssl_shutdown_timeout=self.ssl_shutdown_timeout_s,
            )
        except (OSError, TimeoutError, EOFError) as exc:  # ssl.SSLError is an OSError
            reason = refusal_reason(exc)
            if reason is not None and self.on_refused is not None:
                self.on_refused(address, reason)
            return False
        self.handshakes += 1
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.session_reused:
            self.resumed += 1
        return True
