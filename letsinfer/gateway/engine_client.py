"""A small pooled HTTP/1.1 client for the gateway's requests to engines.

Why not httpx: the gateway sits on every request's path, and a profile of
httpx's async stack showed it as the largest cost per forwarded request.
Engines speak plain HTTP/1.1 on a private port, so this client does only
that: keep-alive connections per engine, one request per connection at a
time, response parsing by httptools (the parser uvicorn uses), bodies handed
over chunk by chunk as they arrive, and back-pressure so a slow client never
makes the gateway buffer a whole answer.

A response is read one of two ways: awaited by a coroutine
(:class:`EngineResponse`: its headers, then its body chunk by chunk), or
told part by part to a listener from the connection's own callbacks
(:class:`CallbackResponse`, for the gateway's express lane, which has no
coroutine to wait in).

Errors say whether anything of the response had arrived, because only then is
it unsafe to try another engine.

The same client reaches external providers (letsinfer.gateway.external): an
``https`` base URL gets TLS, verified against the system's CAs or a given CA
file, and a base URL with a path (``https://host/v1``) has the request's
``/v1`` replaced by that path.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable, Sequence
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from letsinfer.batched_writes import BatchedTransport

# Pause reading from an engine once this much body waits for a slow client.
_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024
_MAX_IDLE_PER_ENGINE = 256


class EngineError(Exception):
    """The exchange failed. ``before_response`` is true when no status line
    had arrived, so the request may be sent elsewhere."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class EngineTimeout(EngineError):
    pass


class ConnectTimeout(EngineTimeout):
    """The engine did not accept the connection in time: it never saw the request."""


class AnswerTooLarge(EngineError):
    """A whole answer past the size the gateway keeps in memory to relay it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, before_response=False)


class Unsolicited(Exception):
    """A second response after the one asked for: the connection can carry
    nothing more (its next answer could be anyone's)."""

    def __init__(self) -> None:
        super().__init__("a response nobody asked for followed the answer")


class _Connection(asyncio.Protocol):
    """One TCP connection to an engine, carrying one exchange at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: BatchedTransport | None = None
        self.closed = False
        self.reused = False
        self._exchange: _Response | None = None
        # One read-timeout check per connection, not a timer per exchange:
        # armed when none is, it looks at whichever exchange is running then.
        self._check: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Written at the end of the loop's turn unless flushed (post_on_idle's hold).
        self.transport = BatchedTransport(transport, self.loop)

    def data_received(self, data: bytes) -> None:
        ex = self._exchange
        if ex is None:  # bytes nobody asked for: the connection is unusable
            self.abort()
            return
        ex.last_activity = self.loop.time()
        try:
            ex.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            ex.deliver()
            why = exc.__cause__ if isinstance(exc.__cause__, Unsolicited) else exc
            ex.fail(EngineError(f"bad response from engine: {why}", before_response=ex.status == 0))
            self.abort()
        else:
            ex.deliver()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_checking()
        ex = self._exchange
        if ex is not None and not ex.complete:
            if ex.status and ex.until_eof:
                ex.on_message_complete()  # a body delimited by the connection's end
            else:
                reason = str(exc) if exc else "the engine closed the connection"
                ex.fail(EngineError(reason, before_response=ex.status == 0))

    # -- used by the exchange ----------------------------------------------
    def abort(self) -> None:
        self.closed = True
        self._stop_checking()
        if self.transport is not None:
            self.transport.abort()

    def check_in(self, delay: float) -> None:
        """Check the running exchange's read timeout ``delay`` seconds from now,
        or sooner if a check is due sooner already (it finds the deadline
        further off and checks again then)."""
        if self._check is None:
            self._check = self.loop.call_later(delay, self._check_exchange)

    def _check_exchange(self) -> None:
        self._check = None
        ex = self._exchange
        if ex is not None and not ex.complete:
            ex.check_idle()

    def _stop_checking(self) -> None:
        if self._check is not None:
            self._check.cancel()
            self._check = None

    def finished(self, keep_alive: bool) -> None:
        self._exchange = None
        if keep_alive and not self.closed:
            self.reused = True
            self.pool.put(self)
        else:
            self.abort()


class _Response:
    """What both kinds of exchange share: the status line and headers parsed by
    httptools, and a read timeout that fails an engine gone quiet."""

    __slots__ = (
        "complete",
        "conn",
        "content_type",
        "last_activity",
        "parser",
        "read_timeout",
        "retry_after",
        "status",
        "until_eof",
    )

    def __init__(self, conn: _Connection, read_timeout: float) -> None:
        self.conn = conn
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.content_type = b"application/json"
        self.retry_after: bytes | None = None  # a provider's, relayed with its 429
        self.until_eof = True  # until a Content-Length or chunked header says otherwise
        self.complete = False
        self.read_timeout = read_timeout
        self.last_activity = conn.loop.time()
        conn.check_in(read_timeout)

    # -- httptools callbacks -----------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            raise Unsolicited
        name = name.lower()
        if name == b"content-type":
            self.content_type = value
        elif name == b"content-length" or (
            name == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self.until_eof = False
        elif name == b"retry-after":
            self.retry_after = value

    # Each kind's on_headers_complete refuses a response after the one asked
    # for (Unsolicited) and leaves ``status`` at 0 for an interim answer (a 103
    # Early Hints: the answer itself follows, on the same exchange), which its
    # on_message_complete then passes over.

    def on_message_complete(self) -> None:
        raise NotImplementedError

    def deliver(self) -> None:
        """After each read is parsed: pass on the body parts kept from it."""

    def fail(self, error: EngineError) -> None:
        raise NotImplementedError

    # -- timeouts -------------------------------------------------------------
    def _waiting_on_client(self) -> bool:
        return False

    def check_idle(self) -> None:
        idle = self.conn.loop.time() - self.last_activity
        if self._waiting_on_client() or idle < self.read_timeout:
            self.conn.check_in(self.read_timeout - min(idle, self.read_timeout) + 0.01)
            return
        self.fail(
            EngineTimeout(
                f"no data from the engine for {self.read_timeout:g}s",
                before_response=self.status == 0,
            )
        )
        self.conn.abort()

    def close(self) -> None:
        """Stop the exchange; an unfinished one closes its connection, which is
        how the engine learns the client went away."""
        if self.conn._exchange is self:  # not handed back to the pool yet
            self.complete = True
            self.conn._exchange = None
            self.conn.abort()


class EngineResponse(_Response):
    """The response to one request; the body is read with :meth:`next_chunk`."""

    __slots__ = (
        "_chunks",
        "_error",
        "_headers_done",
        "_keep_alive_after_drain",
        "_waiter",
        "buffered",
        "paused",
    )

    def __init__(self, conn: _Connection, read_timeout: float) -> None:
        super().__init__(conn, read_timeout)
        self.paused = False
        self.buffered = 0
        self._chunks: collections.deque[bytes] = collections.deque()
        self._error: EngineError | None = None
        self._headers_done: asyncio.Future[None] = conn.loop.create_future()
        self._waiter: asyncio.Future[None] | None = None
        self._keep_alive_after_drain = False

    # -- httptools callbacks -----------------------------------------------
    def on_headers_complete(self) -> None:
        if self.complete:
            raise Unsolicited
        status = self.parser.get_status_code()
        if status >= 200:
            self.status = status
            if not self._headers_done.done():
                self._headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.conn.transport:
            self.paused = True
            self.conn.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self.status:  # an interim answer's end
            return
        self.complete = True
        self._wake()
        keep_alive = self.parser.should_keep_alive() and not self.until_eof
        if not self._chunks:
            self.conn.finished(keep_alive)
        else:  # hand the connection back once the reader has taken the rest
            self._keep_alive_after_drain = keep_alive

    # -- failure and timeouts -----------------------------------------------
    def fail(self, error: EngineError) -> None:
        if self._error is None and not self.complete:
            self._error = error
            if not self._headers_done.done():
                self._headers_done.set_exception(error)
                self._headers_done.exception()  # retrieved: no "never retrieved" noise
            self._wake()

    def _waiting_on_client(self) -> bool:
        return self.paused  # a paused reader is the client's doing

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- reader API ---------------------------------------------------------
    async def wait_headers(self) -> None:
        await self._headers_done

    async def next_chunk(self) -> bytes | None:
        """The body received since the last call (waiting for some if none), or
        None at its end."""
        while True:
            if self._chunks:
                # Everything that has arrived, in one piece: under load this
                # turns many small writes to the client into one.
                if len(self._chunks) == 1:
                    chunk = self._chunks.popleft()
                else:
                    chunk = b"".join(self._chunks)
                    self._chunks.clear()
                self.buffered -= len(chunk)
                if self.paused and self.buffered < _LOW_WATER and self.conn.transport:
                    self.paused = False
                    self.conn.transport.resume_reading()
                if self.complete and not self._chunks:
                    self.conn.finished(self._keep_alive_after_drain)
                return chunk
            if self._error is not None:
                raise self._error
            if self.complete:
                return None
            self._waiter = self.conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; past ``limit`` bytes the exchange is closed and
        :class:`AnswerTooLarge` raised (nothing more is kept)."""
        parts = []
        size = 0
        while (chunk := await self.next_chunk()) is not None:
            size += len(chunk)
            if limit is not None and size > limit:
                self.close()
                raise AnswerTooLarge(f"the answer is larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)


class ResponseListener(Protocol):
    """Told of a :class:`CallbackResponse`, in order: its status line and
    headers, each part of its body, its end; or, at any point instead, its
    failure. Each at most once, none after :meth:`CallbackResponse.close`."""

    def response_started(self, response: CallbackResponse) -> None: ...

    def response_body(self, response: CallbackResponse, body: bytes) -> None: ...

    def response_ended(self, response: CallbackResponse) -> None: ...

    def response_failed(self, response: CallbackResponse, error: EngineError) -> None: ...


class CallbackResponse(_Response):
    """An exchange driven by callbacks alone, for a caller with no coroutine to
    wait in (letsinfer.gateway.express): what arrives goes straight to its
    listener. The listener stops the engine while its own client catches up
    with :meth:`pause` and :meth:`resume`."""

    __slots__ = ("listener", "parts", "paused")

    def __init__(self, conn: _Connection, read_timeout: float, listener: ResponseListener) -> None:
        self.parts: list[bytes] = []  # parsed from the current read, not yet passed on
        super().__init__(conn, read_timeout)  # (its parser takes on_body: parts must exist)
        self.listener = listener
        self.paused = False

    def on_headers_complete(self) -> None:
        if self.complete:
            raise Unsolicited
        status = self.parser.get_status_code()
        if status >= 200:
            self.status = status
            self.listener.response_started(self)

    @property
    def on_body(self) -> Callable[[bytes], None]:
        """What the parser calls with each body chunk: kept until the read is
        parsed, because an engine streams each event as a chunk of its own
        and a read holds many; the listener gets them as one part (as the
        handler's next_chunk() does), not one by one. The list's own append,
        which httptools takes once per parser: no Python call per chunk."""
        return self.parts.append

    def deliver(self) -> None:
        parts = self.parts
        if parts and not self.complete:
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            parts.clear()
            self.listener.response_body(self, body)

    def on_message_complete(self) -> None:
        if not self.status:  # an interim answer's end
            return
        self.deliver()
        self.complete = True
        self.resume()  # (the last bytes can come in the read before a pause)
        self.conn.finished(self.parser.should_keep_alive() and not self.until_eof)
        self.listener.response_ended(self)

    def fail(self, error: EngineError) -> None:
        if not self.complete:
            self.complete = True
            self.listener.response_failed(self, error)

    def pause(self) -> None:
        if not self.paused and self.conn.transport is not None:
            self.paused = True
            self.conn.transport.pause_reading()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.last_activity = self.conn.loop.time()  # its quiet time was the client's
            if self.conn.transport is not None and not self.conn.closed:
                self.conn.transport.resume_reading()

    def _waiting_on_client(self) -> bool:
        return self.paused


class _Pool:
    def __init__(
        self, host: str, port: int, tls: ssl.SSLContext | None = None, prefix: str = ""
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.prefix = prefix  # replaces a request path's /v1 (a provider's API base)
        default = 443 if tls is not None else 80
        self.host_header = host if port == default else f"{host}:{port}"
        self.idle: list[_Connection] = []

    def put(self, conn: _Connection) -> None:
        if len(self.idle) < _MAX_IDLE_PER_ENGINE:
            self.idle.append(conn)
        else:
            conn.abort()

    def take(self) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    def close(self) -> None:
        while self.idle:
            self.idle.pop().abort()


class EngineClient:
    """Pooled keep-alive connections to engines, one pool per base URL."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._pools: dict[str, _Pool] = {}
        self._heads: dict[tuple[_Pool, str, str], bytes] = {}

    def _pool(self, base_url: str, ca_file: str | None = None) -> _Pool:
        name = base_url if ca_file is None else f"{base_url} {ca_file}"
        pool = self._pools.get(name)
        if pool is None:
            if not base_url.isascii() or any(c.isspace() for c in base_url):
                # (An authority from before such URLs were refused may hold one.)
                raise EngineError(
                    f"cannot send a request to {base_url!r}: an HTTP request needs an ASCII "
                    "URL without spaces",
                    before_response=True,
                )
            parts = urlsplit(base_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"engine URL must be http(s)://host:port, not {base_url!r}")
            tls = None
            if parts.scheme == "https":
                try:
                    tls = ssl.create_default_context(cafile=ca_file)
                except (OSError, ssl.SSLError) as exc:
                    raise EngineError(
                        f"cannot load the CA file {ca_file}: {exc}", before_response=True
                    ) from exc
            default = 443 if tls is not None else 80
            pool = _Pool(parts.hostname, parts.port or default, tls, parts.path.rstrip("/"))
            self._pools[name] = pool
        return pool

    def _head(self, pool: _Pool, path: str, authorization: str) -> bytes:
        """The request line and fixed headers, built once per engine and path."""
        cache_key = (pool, path, authorization)
        head = self._heads.get(cache_key)
        if head is None:
            if pool.prefix:
                path = pool.prefix + path.removeprefix("/v1")
            lines = [f"POST {path} HTTP/1.1", f"host: {pool.host_header}"]
            if authorization:
                lines.append(f"authorization: {authorization}")
            lines.append("content-type: application/json")
            head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
            self._heads[cache_key] = head
        return head

    def _request(
        self,
        pool: _Pool,
        path: str,
        body: bytes,
        authorization: str,
        extra_headers: Sequence[tuple[str, str]],
    ) -> bytes:
        head = self._head(pool, path, authorization)
        extra = "".join(f"{k}: {v}\r\n" for k, v in extra_headers).encode("latin-1")
        return b"".join((head, extra, b"content-length: %d\r\n\r\n" % len(body), body))

    def post_on_idle(
        self,
        base_url: str,
        path: str,
        body: bytes,
        listener: ResponseListener,
        *,
        authorization: str = "",
        extra_headers: Sequence[tuple[str, str]] = (),
        hold: bool = False,
    ) -> CallbackResponse | None:
        """Send a POST on a kept connection to a plain-HTTP engine and return
        at once; ``listener`` is told of the answer. None (nothing sent) when
        no kept connection is idle: :meth:`post` connects.

        ``hold``: write it at the end of this turn of the loop, with the other
        requests held in it, rather than now (letsinfer.batched_writes; one
        whose connection closes first is never sent). Each write to an idle
        engine wakes it, and on loopback the writer pays for the wake-up; an
        engine that is already answering this gateway is woken once for the
        turn's requests instead of once each."""
        pool = self._pool(base_url)
        if pool.tls is not None:
            return None
        conn = pool.take()
        if conn is None:
            return None
        if conn.transport is None:  # (take() skips closed ones; not yet connected is not kept)
            return None
        response = CallbackResponse(conn, self.read_timeout_s, listener)
        conn._exchange = response
        conn.transport.write(self._request(pool, path, body, authorization, extra_headers))
        if not hold:
            conn.transport.flush()
        return response

    async def _connect(self, pool: _Pool) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(pool),
                    pool.host,
                    pool.port,
                    ssl=pool.tls,
                    server_hostname=pool.host if pool.tls is not None else None,
                ),
                self.connect_timeout_s,
            )
        except TimeoutError as exc:
            raise ConnectTimeout(
                f"connect to {pool.host}:{pool.port} timed out", before_response=True
            ) from exc
        except OSError as exc:
            raise EngineError(
                f"cannot connect to {pool.host}:{pool.port}: {exc.strerror or exc}",
                before_response=True,
            ) from exc
        return conn

    async def post(
        self,
        base_url: str,
        path: str,
        body: bytes,
        *,
        authorization: str = "",
        extra_headers: Sequence[tuple[str, str]] = (),
        ca_file: str | None = None,
    ) -> EngineResponse:
        """Send a POST and return once the response's status and headers arrived.
        ``ca_file``: the CA that signs an https base URL's certificate (default:
        the system's); read once, when the first request to that URL is sent."""
        pool = self._pool(base_url, ca_file)
        request = self._request(pool, path, body, authorization, extra_headers)
        conn = pool.take()
        if conn is not None:
            try:
                return await self._exchange(conn, request)
            except EngineError as exc:
                # An idle keep-alive connection the engine had closed: the
                # request never reached it, so a fresh connection is safe.
                if not exc.before_response or isinstance(exc, EngineTimeout):
                    raise
        return await self._exchange(await self._connect(pool), request)

    async def _exchange(self, conn: _Connection, request: bytes) -> EngineResponse:
        if conn.closed or conn.transport is None:
            raise EngineError("connection closed", before_response=True)
        response = EngineResponse(conn, self.read_timeout_s)
        conn._exchange = response
        conn.transport.write(request)
        conn.transport.flush()
        try:
            await response.wait_headers()
        except BaseException:
            response.close()
            raise
        return response

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
