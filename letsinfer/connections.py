"""Open connections, bounded: how a node's TCP listeners accept and keep them.

Idle or slow clients must not use up the node's file descriptors (then the
gateway, the metrics port and the admin socket all fail together). So every
listener (gateway, metrics, the mutual-TLS planes):

- accepts itself (:class:`Listener`) and stops accepting while it holds its
  cap of open connections: newcomers wait in the kernel's queue, costing the
  node no descriptor, until a connection closes;
- takes at most ``per_client`` connections from one address and closes any
  beyond at once, so one host cannot fill the cap alone;
- closes a connection whose client has not finished a request's headers
  (and the body the gateway holds until it is whole, up to 64 KiB) within
  ``header_timeout_s`` of connecting, or of the first byte of a later request
  (slowloris); uvicorn's keep-alive timeout closes a kept-alive connection
  idle for ``idle_timeout_s``.

Each of these is logged as a warning at most once a minute, with a count.
The request path is untouched: a request whose headers arrive in one read
costs no timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import resource
import socket
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import uvicorn

from letsinfer.batched_writes import BatchedWrites

log = logging.getLogger("letsinfer.connections")

# Descriptors kept for everything but client connections: the planes' and the
# metrics' connections (their caps below), engines' sockets and pipes, SQLite,
# logs, the admin socket, discovery.
RESERVED_FDS = 1024
_ACCEPT_BATCH = 64  # accepts per wake-up, so one listener cannot starve the loop
_ACCEPT_RETRY_S = 0.1  # after an accept error (EMFILE, ENOBUFS): the queue keeps them
LOG_WINDOW_S = 60.0


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    per_client: int
    header_timeout_s: float
    idle_timeout_s: float


# The mutual-TLS planes: the main, nodes and controllers reach them, not the
# LAN at large; a handshake has its own timeout before these apply.
PLANE_LIMITS = ConnectionLimits(
    max_connections=256, per_client=64, header_timeout_s=10.0, idle_timeout_s=5.0
)
# Prometheus scrapers.
METRICS_LIMITS = ConnectionLimits(
    max_connections=32, per_client=8, header_timeout_s=10.0, idle_timeout_s=30.0
)


def raise_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (no
    privilege needed); return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def control_limits(
    max_connections: int, per_client: int, heartbeat_interval_s: float, file_limit: int
) -> ConnectionLimits:
    """The main's control plane: every node keeps one connection open across
    its reports, so the cap leaves room for them all (at most a quarter of
    ``file_limit``), and an idle connection outlives the heartbeat interval
    by far (agents keep theirs three intervals and close first, see
    letsinfer/agent/pacing.py)."""
    cap = max(16, min(max_connections, file_limit // 4))
    if cap < max_connections:
        log.info(
            "control plane: takes at most %d connections at once, not max_connections = %d: "
            "this process may open only %d files, and the control plane keeps to a quarter",
            cap,
            max_connections,
            file_limit,
        )
    return ConnectionLimits(
        max_connections=cap,
        per_client=min(per_client, cap),
        header_timeout_s=PLANE_LIMITS.header_timeout_s,
        idle_timeout_s=max(PLANE_LIMITS.idle_timeout_s, 4 * heartbeat_interval_s + 5),
    )


def gateway_limits(
    max_connections: int,
    per_client: int,
    header_timeout_s: float,
    idle_timeout_s: float,
    file_limit: int,
    reserved: int = RESERVED_FDS,
) -> ConnectionLimits:
    """The gateway's limits under ``file_limit``: a client connection may carry
    one connection to an engine too, and ``reserved`` descriptors (at most
    half the limit; a main adds its control plane's cap) stay for the rest."""
    room = (file_limit - min(reserved, file_limit // 2)) // 2
    cap = max(1, min(max_connections, room))
    if cap < max_connections:
        log.info(
            "gateway: takes at most %d connections at once, not max_connections = %d: this "
            "process may open only %d files, and each client may need a second one to its "
            "engine (raise LimitNOFILE, or ulimit -n, to allow more)",
            cap,
            max_connections,
            file_limit,
        )
    return ConnectionLimits(cap, min(per_client, cap), header_timeout_s, idle_timeout_s)


class Tally:
    """One kind of event, logged at most once per window with how often it
    happened since the last line (the first at once). Event-loop thread only."""

    def __init__(self, message: str, window_s: float = LOG_WINDOW_S) -> None:
        self.message = message  # %-format of (count, last detail)
        self.window_s = window_s
        self.count = 0
        self.last = ""
        self._window: asyncio.TimerHandle | None = None

    def note(self, detail: str = "") -> None:
        self.count += 1
        self.last = detail
        if self._window is None:
            self._flush()

    def _flush(self) -> None:
        self._window = None
        if self.count:
            log.warning(self.message, self.count, self.last)
            self.count = 0
            self._window = asyncio.get_running_loop().call_later(self.window_s, self._flush)

    def close(self) -> None:
        """Log what the current window counted (the listener stops)."""
        if self._window is not None:
            self._window.cancel()
        self._window = None
        if self.count:
            log.warning(self.message, self.count, self.last)
            self.count = 0


def _no_op() -> None:
    return None


# A request's headers, at most: past this the connection gets 431 and is
# closed, instead of the parser buffering all a client sends within the
# header deadline.
MAX_HEAD_BYTES = 128 * 1024
_HEAD_TOO_LARGE_TEXT = b"request headers are larger than 128 KiB\n"
_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n" % len(_HEAD_TOO_LARGE_TEXT)
) + _HEAD_TOO_LARGE_TEXT


class HeaderDeadline:
    """Mixed in front of a uvicorn HTTP protocol class (httptools or h11) by
    :func:`guarded`: closes a connection whose request headers are not complete
    in time, and tells its listener when it closes."""

    header_timeout_s: float = 10.0
    on_late: Callable[[str], None] = staticmethod(lambda address: None)
    release: Callable[[], None] = staticmethod(_no_op)  # set per connection
    _deadline: asyncio.TimerHandle | None = None
    _waiting_after: object = None
    _head_bytes = 0  # of the headers in progress, read after the read they began in
    _in_head = False
    _began = False

    # uvicorn's protocols set these
    cycle: Any
    transport: Any
    client: tuple[str, int] | None
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    # The parser's callbacks (httptools'; h11 bounds its own headers) say
    # when a request's headers begin and end: a read that ends inside them is
    # held until they do, whatever request came before and however it ends.
    def on_message_begin(self) -> None:
        self._in_head, self._began, self._head_bytes = True, True, 0
        super().on_message_begin()  # type: ignore[misc]

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        self._began = False
        super().data_received(data)  # type: ignore[misc]
        # (A read in which the headers began counts for nothing: at most one
        # read, 256 KiB, beyond the cap.)
        if self._in_head and not self._began:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._too_large()
                return
        if self._deadline is None:
            if self.cycle is before and (before is None or before.response_complete):
                self._arm()  # the start of a request's headers, not all of them
        elif self._started():
            self._deadline.cancel()
            self._deadline = None

    def _too_large(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if not self.transport.is_closing():
            self.transport.write(_HEAD_TOO_LARGE)
            self.transport.close()

    def _started(self) -> bool:
        """Whether the awaited request has started: its headers are complete,
        and so is its body when the gateway holds it until it is whole
        (letsinfer.gateway.direct: an unfinished one would hold the
        connection with no handler to time it out)."""
        cycle = self.cycle
        return cycle is not self._waiting_after and not getattr(cycle, "deferred", False)

    def _arm(self) -> None:
        self._waiting_after = self.cycle  # the request before the one awaited
        self._deadline = self.loop.call_later(self.header_timeout_s, self._late)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        try:
            super().connection_lost(exc)  # type: ignore[misc]
        finally:
            self.release()

    def _late(self) -> None:
        self._deadline = None
        if self._started():  # it did, after all
            return
        if not self.transport.is_closing():
            self.on_late(self.client[0] if self.client else "local")
            self.transport.close()


def guarded(base: type, header_timeout_s: float, on_late: Callable[[str], None]) -> type:
    """``base`` (a uvicorn HTTP protocol class) with a header deadline."""
    return type(
        f"Guarded{base.__name__}",
        (HeaderDeadline, base),
        {"header_timeout_s": header_timeout_s, "on_late": staticmethod(on_late)},
    )


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


ProtocolFactory = Callable[[], asyncio.Protocol]


class Listener:
    """Accepts on a listening socket within :class:`ConnectionLimits` and
    hands each connection to ``protocol()`` (a :class:`HeaderDeadline`
    protocol, whose closing frees its slot). ``admit(address)`` may refuse a
    source outright. Subclasses change how a connection is set up
    (:meth:`_connect`: the planes run a TLS handshake there)."""

    def __init__(
        self,
        sock: socket.socket,
        limits: ConnectionLimits,
        protocol: ProtocolFactory,
        *,
        name: str,
        admit: Callable[[str], bool] | None = None,
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.limits = limits
        self.protocol = protocol
        self.name = name
        self.admit = admit
        self.open = 0
        self.by_source: dict[str, int] = {}
        self.pending: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self._closed = False
        self.at_cap = Tally(
            f"{name}: at its cap of {limits.max_connections} open connections, new ones "
            "wait in the kernel's queue (%d time(s); %s)"
        )
        self.crowded = Tally(
            f"{name}: closed %d connection(s) at once from a source already holding "
            f"{limits.per_client} (last: %s)"
        )
        self.refused = Tally(f"{name}: closed %d connection(s) from sources not allowed (last: %s)")
        self.failed = Tally(f"{name}: accepting failed %d time(s): %s")

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._resume()

    def _resume(self) -> None:
        if not self._reading and not self._closed and self._loop is not None:
            self._loop.add_reader(self.sock.fileno(), self._accept)
            self._reading = True

    def _pause(self) -> None:
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
            self._reading = False

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            if self.open >= self.limits.max_connections:
                self._pause()  # resumed when one closes
                self.at_cap.note(f"{len(self.by_source)} source(s) hold them")
                return
            try:
                conn, peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors or buffers: they wait in the queue
                self.failed.note(str(exc))
                self._pause()
                assert self._loop is not None
                self._loop.call_later(_ACCEPT_RETRY_S, self._resume)
                return
            address = str(peer[0]) if isinstance(peer, tuple) else "local"
            if self.admit is not None and not self.admit(address):
                self.refused.note(address)
                conn.close()
            elif self.by_source.get(address, 0) >= self.limits.per_client:
                self.crowded.note(address)
                conn.close()
            else:
                self._take(conn, address)

    def _take(self, conn: socket.socket, address: str) -> None:
        self.open += 1
        self.by_source[address] = self.by_source.get(address, 0) + 1
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            self.open -= 1
            left = self.by_source[address] - 1
            if left:
                self.by_source[address] = left
            else:
                del self.by_source[address]
            if self.open < self.limits.max_connections:
                self._resume()

        conn.setblocking(False)
        assert self._loop is not None
        task = self._loop.create_task(self._run_connect(conn, address, release))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def factory(self, release: Callable[[], None]) -> ProtocolFactory:
        def make() -> asyncio.Protocol:
            proto = self.protocol()
            proto.release = release  # type: ignore[attr-defined]
            return proto

        return make

    async def _run_connect(
        self, conn: socket.socket, address: str, release: Callable[[], None]
    ) -> None:
        made = False
        try:
            made = await self._connect(conn, address, self.factory(release))
        finally:
            if not made:  # the protocol never ran: nobody else frees the slot
                release()
                conn.close()

    async def _connect(self, conn: socket.socket, address: str, factory: ProtocolFactory) -> bool:
        """Attach the protocol to an accepted socket; False if that failed."""
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(factory, conn)
        except OSError:
            return False
        return True

    async def close(self, keep: Callable[[socket.socket], object] | None = None) -> None:
        """Stop accepting; ``keep(sock)`` may give the listening socket to
        another process first (a restart: waiting clients are not refused)."""
        self._closed = True
        self._pause()
        if keep is not None:
            keep(self.sock)
        for tally in (self.at_cap, self.crowded, self.refused, self.failed):
            tally.close()
        for task in self.pending:
            task.cancel()
        await asyncio.gather(*self.pending, return_exceptions=True)
        self.sock.close()


class GuardedServer(uvicorn.Server):
    """uvicorn serving through a :class:`Listener` of its own: bounded
    connections, header and idle timeouts. ``embedded`` servers run beside the
    node's main server on its loop and leave the process signals to it."""

    scheme = "http"
    security = ""  # how connections are secured, for the log line

    def __init__(
        self,
        config: uvicorn.Config,
        limits: ConnectionLimits,
        *,
        name: str,
        admit: Callable[[str], bool] | None = None,
        embedded: bool = False,
        batch_writes: bool = False,
        protocol_mixins: tuple[type, ...] = (),
        inherited: socket.socket | None = None,
        keep_listener: Callable[[socket.socket], object] | None = None,
    ) -> None:
        config.timeout_keep_alive = limits.idle_timeout_s  # type: ignore[assignment]
        super().__init__(config)
        self.limits = limits
        self.name = name
        self.admit = admit
        self.embedded = embedded
        # The gateway's answers: one write per turn of the loop (letsinfer.batched_writes).
        self.batch_writes = batch_writes
        # In front of the HTTP protocol class (the gateway's inference path).
        self.protocol_mixins = protocol_mixins
        # A restart's listening socket, kept open by the previous process
        # (service/listener.py), and what hands ours on when we restart.
        self.inherited = inherited
        self.keep_listener = keep_listener
        self.listener: Listener | None = None
        self.late = Tally(
            f"{name}: closed %d connection(s) that sent no complete request headers "
            f"(or held body) within {limits.header_timeout_s:g}s (last from %s)"
        )
        self.port = 0

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if self.embedded:
            yield  # the node's primary server handles SIGINT/SIGTERM
            return
        with super().capture_signals():
            yield

    def make_listener(self, sock: socket.socket, protocol: ProtocolFactory) -> Listener:
        return Listener(sock, self.limits, protocol, name=self.name, admit=self.admit)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config = self.config
        # fails before any startup work
        sock = self.inherited or listening_socket(config.host, config.port)
        self.inherited = None
        try:
            await super().startup(sockets=[])  # lifespan only: uvicorn listens on nothing
        except BaseException:
            sock.close()
            raise
        loop = asyncio.get_running_loop()
        cls = config.http_protocol_class
        if self.batch_writes:
            cls = type(f"Batched{cls.__name__}", (BatchedWrites, cls), {})
        if self.protocol_mixins:
            cls = type(cls.__name__, (*self.protocol_mixins, cls), {})
        # Outermost: it hears of every request's start, even where a mixin
        # (the gateway's direct path) takes the parser's callbacks itself.
        cls = guarded(cls, self.limits.header_timeout_s, self.late.note)

        def protocol() -> asyncio.Protocol:
            return cls(  # type: ignore[no-any-return]
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=loop,
            )

        self.listener = self.make_listener(sock, protocol)
        self.listener.start()
        self.port = sock.getsockname()[1]
        lim = self.limits
        log.info(
            "%s: listening on %s://%s:%d (%sat most %d connections, %d per client; "
            "header timeout %gs, idle %gs)",
            self.name,
            self.scheme,
            config.host,
            self.port,
            self.security,
            lim.max_connections,
            lim.per_client,
            lim.header_timeout_s,
            lim.idle_timeout_s,
        )

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.listener is not None:
            await self.listener.close(keep=self.keep_listener)
        await super().shutdown(sockets=sockets)
        self.late.close()


def address_filter(networks: tuple[str, ...], *, loopback: bool) -> Callable[[str], bool]:
    """Whether a peer address may connect: in one of ``networks`` (an
    IPv4-mapped IPv6 address as its IPv4 one), or loopback when ``loopback``."""
    parsed = [ipaddress.ip_network(n, strict=False) for n in networks]

    def admit(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return (loopback and ip.is_loopback) or any(ip in n for n in parsed)

    return admit
