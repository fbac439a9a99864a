"""Verified peer identity on the mutual-TLS planes (control :8443, agent :8444).

uvicorn verifies client certificates but does not put them in the ASGI scope.
This module owns the gap: an HTTP protocol class (passed to uvicorn's
``http=``) reads the verified certificate from the connection's ``ssl_object``
and adds the ASGI ``tls`` extension to every request on that connection; the
``PeerGate`` middleware turns it into a :class:`Peer` and refuses a request
without one before any handler runs (only explicitly open paths pass).
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from letsinfer.trust.pki import CertIdentity, CertificateError, fingerprint, identity_of, load_cert

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]
ASGIApp = Callable[[Scope, Receive, Send], Any]


@dataclass(frozen=True)
class Peer:
    identity: CertIdentity
    address: str | None


def _with_tls(app: ASGIApp, der: bytes | None) -> ASGIApp:
    chain = []
    if der:
        pem = load_cert(der).public_bytes(serialization.Encoding.PEM).decode()
        chain = [pem]

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("extensions", {})["tls"] = {
                "client_cert_chain": chain,
                "client_cert_der": der,
            }
        await app(scope, receive, send)

    return wrapped


class PeerCertProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (its C parser: every node's reports come
    through here), plus the verified client certificate in scope."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(True) if ssl_object is not None else None
        self.app = _with_tls(self.app, der)


@functools.lru_cache(maxsize=8192)
def _identity(der: bytes) -> CertIdentity:
    """A verified certificate's identity, parsed once per certificate."""
    return identity_of(load_cert(der))


def peer_of(scope: Scope) -> Peer | None:
    tls = scope.get("extensions", {}).get("tls") or {}
    der = tls.get("client_cert_der")
    if not der:
        return None
    try:
        ident = _identity(der)
    except CertificateError:
        return None
    client = scope.get("client")
    return Peer(identity=ident, address=client[0] if client else None)


def gated_peer(request: Any) -> Peer:
    """The verified peer a gate put in front of this route (a PeerGate, or the
    admin socket's peer-credential gate); a route behind one always has it."""
    found = request.scope.get("state", {}).get("peer")
    assert found is not None  # every gate in front of these routes sets one
    return found  # type: ignore[no-any-return]


Denial = Callable[[Scope, Peer | None, str], None]


class Refusal(str):
    """A reason to refuse that also names a machine-readable code, for refusals
    the peer acts on (a removed node stops its engines)."""

    code: str

    def __new__(cls, reason: str, code: str) -> Refusal:
        made = super().__new__(cls, reason)
        made.code = code
        return made


NODE_REMOVED = "node_removed"


async def refuse(send: Send, reason: str, code: str) -> None:
    """A gate's 403, OpenAI-shaped, sent before any route runs."""
    body = json.dumps(
        {"error": {"message": reason, "type": "permission_error", "code": code}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class PeerGate:
    """Refuse, before routing, any request without a verified letsinfer peer.

    ``open_paths`` are reachable without a certificate (enrollment, pairing);
    ``admit(peer, path)`` decides whether a verified peer may use this path
    (revocation, node-vs-controller) and returns a reason to refuse, or None.
    """

    def __init__(
        self,
        app: ASGIApp,
        open_paths: Iterable[str],
        admit: Callable[[Peer, str], str | None],
        on_denied: Denial,
    ) -> None:
        self.app = app
        self.open_paths = frozenset(open_paths)
        self.admit = admit
        self.on_denied = on_denied

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        peer = peer_of(scope)
        scope.setdefault("state", {})["peer"] = peer
        if scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        reason = (
            "no verified client certificate" if peer is None else self.admit(peer, scope["path"])
        )
        if reason is not None:
            self.on_denied(scope, peer, reason)
            await refuse(send, reason, getattr(reason, "code", "peer_refused"))
            return
        await self.app(scope, receive, send)


class Presenting:
    """The TLS context that presents a node certificate now.

    A renewal builds a whole new context and swaps it in (:meth:`renew`); a
    context once handed out is never changed. OpenSSL does not allow changing
    a context's certificate while connections are made from it on other
    threads, and CPython lets go of the GIL both while loading a certificate
    and while starting a connection: on the main, the control thread runs the
    planes' handshakes while the gateway's loop renews, so a certificate
    reloaded in place could be freed under a handshake starting on the other
    thread. Whoever makes connections reads :attr:`context` for each one (a
    plane's listener, a client per call); connections already made keep the
    context they started with. :attr:`fingerprint` is the certificate's, for
    what the node says of itself (``/v1/identity``, mDNS).
    """

    def __init__(self, build: Callable[[], ssl.SSLContext], cert: Path) -> None:
        self._build = build
        self._cert = cert
        self.renew()

    def renew(self) -> None:
        context = self._build()
        self.fingerprint = fingerprint(load_cert(Path(self._cert).read_bytes()))
        self.context = context  # one reference swapped: atomic under the GIL


# Every live holder presenting a node certificate, by the certificate's path:
# a renewal renews them all, so running planes and clients present the new
# certificate at their next connection, with no restart (letsinfer.trust.renewal).
_presenting: dict[Path, weakref.WeakSet[Presenting]] = {}
_presenting_lock = threading.Lock()  # renewals and new clients come from both threads


def _registered(cert: Path, build: Callable[[], ssl.SSLContext]) -> Presenting:
    made = Presenting(build, cert)
    with _presenting_lock:
        _presenting.setdefault(Path(cert).resolve(), weakref.WeakSet()).add(made)
    return made


def reload_certificate(cert: Path) -> int:
    """Every live holder presenting ``cert`` (renewed in place on disk) builds
    a new context from it; return how many. A client's new context starts
    with no TLS sessions kept: a resumed session would show the server the
    old certificate."""
    with _presenting_lock:
        holders = list(_presenting.get(Path(cert).resolve(), ()))
    for holder in holders:
        holder.renew()
    return len(holders)


def server_context(cert: Path, key: Path, ca: Path | None) -> ssl.SSLContext:
    """TLS for a plane: our certificate; client certificates verified against
    the cluster CA when presented (the gate then requires them)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if ca is not None:
        ctx.load_verify_locations(cafile=str(ca))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def presenting_server(cert: Path, key: Path, ca: Path | None) -> Presenting:
    """A plane's :func:`server_context`, renewed with its certificate."""
    return _registered(cert, lambda: server_context(cert, key, ca))


class ResumingContext(ssl.SSLContext):
    """A client context that offers each server the TLS session it last gave
    this context (:meth:`remember`), so a reconnecting agent resumes instead
    of a full handshake: no certificate signature or chain check on either
    side. A server that cannot resume it (it restarted) just runs a full one.
    The session carries the verified peer certificate: identity checks see it
    as after a full handshake."""

    sessions: dict[str, ssl.SSLSession]

    def _session(self, server_hostname: str | bytes | None) -> ssl.SSLSession | None:
        sessions = getattr(self, "sessions", None)
        if not sessions:
            return None
        if isinstance(server_hostname, bytes):  # as some callers pass it
            server_hostname = server_hostname.decode("ascii", "replace")
        return sessions.get(server_hostname or "")

    def remember(self, ssl_object: ssl.SSLObject | ssl.SSLSocket) -> None:
        session = ssl_object.session
        if session is not None and session.has_ticket:
            if not hasattr(self, "sessions"):
                self.sessions = {}
            self.sessions[ssl_object.server_hostname or ""] = session

    def wrap_bio(  # type: ignore[override]
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return super().wrap_bio(
            incoming,
            outgoing,
            server_side,
            server_hostname,
            session=session or self._session(server_hostname),
        )

    def wrap_socket(  # type: ignore[override]
        self,
        sock: Any,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        return super().wrap_socket(
            sock,
            server_side,
            do_handshake_on_connect,
            suppress_ragged_eofs,
            server_hostname,
            session=session or self._session(server_hostname),
        )


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """Verify the server against the cluster CA only; identity is checked by
    node id in its certificate, not by host name (nodes move between addresses)."""
    ctx = ResumingContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=str(ca))
    if cert is not None and key is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def presenting_client(ca: Path, cert: Path, key: Path) -> Presenting:
    """A node's :func:`client_context` for the calls it makes as itself,
    renewed with its certificate."""
    return _registered(cert, lambda: client_context(ca, cert, key))
