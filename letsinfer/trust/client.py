"""Mutual-TLS calls between cluster members (node to main, main to agent,
controller to main), with the peer's certificate identity checked."""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from letsinfer.trust import pki
from letsinfer.trust.material import TlsFiles
from letsinfer.trust.peer import ResumingContext, presenting_client


class PeerMismatch(Exception):
    pass


class ClusterClient:
    """``keepalive_s``: keep one connection open across calls for that long
    while idle (an agent's heartbeat: the main's control plane keeps it longer,
    see letsinfer.connections.control_limits); None: a connection per call.
    Either way a new connection resumes the TLS session the last one got."""

    def __init__(
        self,
        files: TlsFiles,
        expect_node: str | None = None,
        timeout: float = 10.0,
        keepalive_s: float | None = None,
    ) -> None:
        if files.ca is None:
            raise ValueError("not enrolled: no cluster CA to verify peers with")
        self._tls = presenting_client(files.ca, files.cert, files.key)
        self._expect_node = expect_node
        self._timeout = timeout
        self._keepalive_s = keepalive_s
        self._client: httpx.AsyncClient | None = None
        self._client_ctx: ssl.SSLContext | None = None  # the context _client was made with

    def request(self, method: str, url: str, json: Any = None) -> httpx.Response:
        with httpx.Client(verify=self._tls.context, timeout=self._timeout) as client:
            resp = client.request(method, url, json=json)
            self._check_peer(resp)
            return resp

    async def arequest(self, method: str, url: str, json: Any = None) -> httpx.Response:
        if self._keepalive_s is None:
            async with httpx.AsyncClient(verify=self._tls.context, timeout=self._timeout) as client:
                resp = await client.request(method, url, json=json)
                self._check_peer(resp)
                return resp
        if self._client is not None and self._client_ctx is not self._tls.context:
            await self.aclose()  # kept connections present the certificate before a renewal
        if self._client is None:
            self._client_ctx = self._tls.context
            self._client = httpx.AsyncClient(
                verify=self._client_ctx,
                timeout=self._timeout,
                limits=httpx.Limits(max_connections=4, keepalive_expiry=self._keepalive_s),
            )
        resp = await self._client.request(method, url, json=json)
        self._check_peer(resp)
        return resp

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def async_client(self, timeout: float | None = 10.0) -> httpx.AsyncClient:
        """A raw client with this node's TLS (for streaming downloads)."""
        return httpx.AsyncClient(verify=self._tls.context, timeout=timeout)

    def _check_peer(self, resp: httpx.Response) -> None:
        stream = resp.extensions.get("network_stream")
        ssl_object = stream.get_extra_info("ssl_object") if stream else None
        # Kept by the context that made the connection: a session from before
        # a renewal dies with the old context.
        if ssl_object is not None and isinstance(ssl_object.context, ResumingContext):
            ssl_object.context.remember(ssl_object)
        if self._expect_node is None:
            return
        ident = pki.identity_of(pki.load_cert(peer_certificate(resp)))
        if ident.kind != "node" or ident.id != self._expect_node:
            raise PeerMismatch(f"the peer is {ident.kind} {ident.id}, not node {self._expect_node}")


def peer_certificate(resp: httpx.Response) -> bytes:
    """The server certificate (DER) of the connection that carried ``resp``;
    call it while the client is still open."""
    stream = resp.extensions.get("network_stream")
    ssl_object: ssl.SSLObject | None = stream.get_extra_info("ssl_object") if stream else None
    der = ssl_object.getpeercert(True) if ssl_object else None
    if not der:
        raise PeerMismatch("the peer presented no certificate")
    return der


def _error(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    err = body.get("error") if isinstance(body, dict) else None
    return err if isinstance(err, dict) else {}


def error_message(resp: httpx.Response) -> str:
    """The message of a letsinfer error answer ({"error": {"message", "code"}})."""
    return str(_error(resp).get("message") or resp.text or f"HTTP {resp.status_code}")


def error_code(resp: httpx.Response) -> str | None:
    code = _error(resp).get("code")
    return code if isinstance(code, str) else None
