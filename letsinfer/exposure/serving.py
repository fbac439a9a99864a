"""The exposed listener: the gateway's own app over TLS on one port, beside
(not instead of) the plain listener, on the gateway's loop.

The certificate is read again when its file or its key's file changes on
disk (inode, size or mtime), looked at once per new connection — two
``stat`` calls beside a TLS handshake — so a renewed certificate (certbot,
`exposure enable --cluster-ca` again) is served to the next connection
without a restart. A replacement that does not load (a key not yet written,
a broken file) is logged and the previous certificate is served meanwhile.
Connections from sources outside the listed networks are closed as they are
accepted (the firewall drops them before, where it is loaded).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from letsinfer.config import GatewaySettings
from letsinfer.connections import (
    ConnectionLimits,
    GuardedServer,
    Listener,
    ProtocolFactory,
    address_filter,
)
from letsinfer.exposure.certificate import CertificateRefused, check_pair, server_context
from letsinfer.exposure.settings import Exposure, load
from letsinfer.home import Home
from letsinfer.planes import RunningPlane
from letsinfer.trust.handshake import TlsListener

log = logging.getLogger("letsinfer.exposure")

SSL_SHUTDOWN_S = 2.0


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class ServedCertificate:
    """The TLS context the exposed listener presents now; ``context`` is read
    once per connection (TlsListener) and rebuilt when the files changed."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert = cert
        self.key = key
        self._seen = (_signature(cert), _signature(key))
        self._context = server_context(cert, key)
        self.reloads = 0

    @property
    def context(self) -> ssl.SSLContext:
        seen = (_signature(self.cert), _signature(self.key))
        if seen != self._seen:
            try:
                check_pair(self.cert, self.key)
                self._context = server_context(self.cert, self.key)
            except (CertificateRefused, ssl.SSLError, OSError) as exc:
                # (A pair half-written is tried again at the next connection.)
                log.warning("exposure: still serving the previous certificate: %s", exc)
                return self._context
            self._seen = seen
            self.reloads += 1
            log.info("exposure: serving the renewed certificate %s", self.cert)
        return self._context


class ExposedServer(GuardedServer):
    scheme = "https"
    security = "TLS; "

    def __init__(
        self,
        config: uvicorn.Config,
        limits: ConnectionLimits,
        tls: ServedCertificate,
        admit: Callable[[str], bool],
        **kwargs: Any,
    ) -> None:
        super().__init__(config, limits, name="exposure", admit=admit, embedded=True, **kwargs)
        self.tls = tls

    def make_listener(self, sock: socket.socket, protocol: ProtocolFactory) -> Listener:
        listener = TlsListener(sock, self.limits, protocol, self.tls, None, name=self.name)  # type: ignore[arg-type]
        listener.admit = self.admit
        # Internet clients that keep a connection idle must not hold `disable` or a stop.
        listener.ssl_shutdown_timeout_s = SSL_SHUTDOWN_S
        return listener


def exposure_limits(gw: GatewaySettings) -> ConnectionLimits:
    """The gateway's timeouts; a share of its connection cap (the plain
    listener keeps the rest)."""
    cap = max(1, min(gw.max_connections, 4096))
    return ConnectionLimits(
        max_connections=cap,
        per_client=min(cap, gw.max_connections_per_client),
        header_timeout_s=gw.header_timeout_s,
        idle_timeout_s=gw.idle_timeout_s,
    )


def exposed_server(app: Any, exposure: Exposure, gw: GatewaySettings) -> ExposedServer:
    """The gateway's ``app`` over TLS on the exposure's port. Raises
    CertificateRefused for a pair that cannot be served."""
    from letsinfer.gateway.app import direct_path

    check_pair(Path(exposure.cert), Path(exposure.key))
    tls = ServedCertificate(Path(exposure.cert), Path(exposure.key))
    config = uvicorn.Config(
        app,
        http="httptools",  # the gateway's direct inference path is built on it
        host=exposure.host,
        port=exposure.port,
        lifespan="off",  # the plain listener's server runs the app's lifespan
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(gw.drain_timeout_s),
    )
    return ExposedServer(
        config,
        exposure_limits(gw),
        tls,
        address_filter(exposure.sources, loopback=False),
        batch_writes=True,
        protocol_mixins=direct_path(app),
    )


class ExposureRunner:
    """The exposed listener of a running main, started, changed and stopped
    on the gateway's loop: at the node's start and when the CLI asks through
    the admin socket (`exposure enable/disable`)."""

    def __init__(self, home: Home, gw: GatewaySettings) -> None:
        self.home = home
        self.gw = gw
        self.app: Any = None  # the gateway's app, from the node's start
        self.running: RunningPlane | None = None
        self.serving: Exposure | None = None
        self.error: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the gateway's, from the start

    async def start(self, app: Any) -> None:
        """At the node's start: what the exposure file says (a failure is logged)."""
        self.app = app
        self.loop = asyncio.get_running_loop()
        await self.apply()

    async def apply_from_control(self) -> dict[str, object]:
        """`apply` for a controller's `exposure enable/disable`, asked on the
        control thread's loop: run on the gateway's loop, which owns the
        listener (not started yet: the start applies it)."""
        if self.loop is None:
            return self.state()
        future = asyncio.run_coroutine_threadsafe(self.apply(), self.loop)
        return await asyncio.wrap_future(future)

    async def apply(self) -> dict[str, object]:
        """Serve what the exposure file says now. A failure leaves what was
        served before in place and is returned (and logged)."""
        try:
            wanted = load(self.home)
        except Exception as exc:  # a damaged file: keep what serves
            self.error = str(exc)
            log.error("exposure: %s", exc)
            return self.state()
        if self.app is None:  # not started yet: the start applies it
            return self.state()
        if wanted == self.serving and (wanted is None or self.running is not None):
            self.error = None
            return self.state()
        if wanted is None:
            await self.stop()
            self.error = None
            log.info("exposure: closed; the inference plane serves the LAN only")
            return self.state()
        try:
            server = exposed_server(self.app, wanted, self.gw)
        except CertificateRefused as exc:
            self.error = str(exc)
            log.error("exposure: not changed: %s", exc)
            return self.state()
        await self.stop()  # the port may be the same: free it first
        plane = RunningPlane(server)
        try:
            await plane.start()
        except (OSError, SystemExit) as exc:
            self.error = f"cannot listen on {wanted.host}:{wanted.port}: {exc}"
            log.error("exposure: %s", self.error)
            return self.state()
        self.running, self.serving, self.error = plane, wanted, None
        log.info(
            "exposure: the inference plane is published on https://%s:%d to %s",
            wanted.host,
            wanted.port,
            ", ".join(wanted.sources),
        )
        return self.state()

    async def stop(self) -> None:
        running, self.running, self.serving = self.running, None, None
        if running is not None:
            await running.stop()

    def state(self) -> dict[str, object]:
        return {
            "listening": self.running is not None,
            "port": self.serving.port if self.serving else None,
            "sources": list(self.serving.sources) if self.serving else [],
            "error": self.error,
        }
