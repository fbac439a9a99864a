"""The express lane: the common inference request, answered from callbacks.

Most requests a gateway sees are of the simplest kind: a key with no rate
limit, budget or cache, a completion or embedding for a model whose replica
has a free slot, and a kept connection to its engine idle. For those the
handler's machinery (a task, futures for the body and for the engine's
headers and each part of its body, a frame per step) costs more than the
work itself: the same checks and bookkeeping driven from protocol callbacks
ran at nearly twice the handler's rate (docs/benchmarks.md). So the
gateway's own connections (letsinfer.gateway.direct) offer each inference
POST whose body is whole to :class:`Express` first. It runs the handler's
checks with the handler's code, sends the body on an idle engine connection,
and answers from that connection's callbacks
(:class:`letsinfer.gateway.engine_client.CallbackResponse`): a plain answer
once it is whole, a stream a read at a time as it arrives (its usage event taken
out as the handler does, and the engine held back while the client is
behind), with the bytes the handler would send, booked through the handler's
own :meth:`InferenceEndpoints.record`.

Everything else goes to the handler (letsinfer.gateway.serving) from the
start: a refused request (its answer and audit come from one place), keys
with limits or a cache, adapters, external models, tracing, a model with
requests queued or no free slot, no idle engine connection. The checks
before the slot change nothing, so handing over loses nothing. Once it
holds a slot, the lane ends a request itself only where the handler's end
would be the same: the engine's answer (any status but 503), its read
timeout (504), a stream broken after its first bytes (an error event), the
client leaving (499). An engine that fails before any byte reached the
client gives the slot back and hands the request to the handler, which
retries as it always does: elsewhere after a 503, an empty stream or a
broken answer; on a fresh connection after a kept one the engine had closed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

from letsinfer.gateway import access_log, adapters, protocol, stream_usage, tags
from letsinfer.gateway.engine_client import CallbackResponse, EngineError, EngineTimeout
from letsinfer.gateway.errors import (
    GatewayError,
    engine_refusal,
    internal_error,
    upstream_failed,
    upstream_timeout,
)
from letsinfer.gateway.exchange import (
    CLIENT_GONE,
    Exchange,
    request_id_from,
    stream_error_event,
)
from letsinfer.gateway.routing import Replica
from letsinfer.gateway.serving import (
    ENDPOINTS,
    FAILED_AT,
    ROUTES,
    InferenceEndpoints,
    authenticate,
)

log = logging.getLogger("letsinfer.gateway")


class DirectCycle(Protocol):
    """What the express lane uses of a request cycle of the gateway's own HTTP
    path (letsinfer.gateway.direct's, which offers it requests): named here,
    the lower side, so that the two modules do not import each other."""

    protocol: Any  # the HTTP protocol: its transport and write flow
    scope: MutableMapping[str, Any]
    body: bytes
    resumes: Callable[[], None] | None

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None: ...
    def start_response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...
    def write(self, body: bytes, more: bool) -> None: ...
    def watch(self, gone: Callable[[], None]) -> Callable[[], None]: ...
    def unwatch(self) -> None: ...
    def start(self) -> None: ...


class _Lane(Exchange):
    """A request in the express lane: what the handler's exchange records, what
    holds its slot, and the listener of its engine's answer."""

    __slots__ = (
        "body",
        "cycle",
        "engine",
        "express",
        "parts",
        "path",
        "relaying",
        "replica",
        "size",
    )

    def __init__(self, request_id: str, express: Express, cycle: DirectCycle) -> None:
        super().__init__(request_id, None)
        self.express = express
        self.cycle = cycle
        self.body = b""
        self.path = ""
        self.replica: Replica | None = None
        self.engine: CallbackResponse | None = None
        self.parts: list[bytes] = []  # a whole answer's, as they arrive
        self.size = 0  # their bytes
        self.relaying = False  # a stream: each part goes on as it arrives

    def client_gone(self) -> None:
        """The client left before its answer was complete: the engine is told
        (its connection closes, which frees its slot) and the request booked."""
        if self.done:
            return
        if self.engine is not None:
            self.engine.close()
        self.express.leave(self)
        self.gone = True
        if self.relaying:
            self.tail = b"".join(self.parts)
        if not (self.status == 200 and self.tail.rstrip().endswith(b"data: [DONE]")):
            # (A client that leaves once it has [DONE] has the whole answer.)
            self.status = CLIENT_GONE
            self.express.gw.metrics.error("client_disconnected")
        self.express.endpoints.record(self)

    # -- the engine's answer (its connection's callbacks: nothing may escape) --
    def response_started(self, engine: CallbackResponse) -> None:
        self.relaying = self.stream and engine.status == 200

    def response_body(self, engine: CallbackResponse, body: bytes) -> None:
        if not self.relaying:
            if not self.done:
                self.parts.append(body)
                self.size += len(body)
                if self.size > self.express.max_answer:
                    self._too_large(engine)
        elif not self.done:
            try:
                self._relay(engine, body)
            except Exception:
                self._failed_unexpectedly()

    def response_ended(self, engine: CallbackResponse) -> None:
        if self.done:
            return
        try:
            if self.relaying:
                if self.responded:
                    self._end_stream()
                else:
                    self._hand_over("empty stream")
            elif engine.status == 503:  # loading or overloaded: another may answer
                self._hand_over("engine answered 503")
            else:
                self._answer(engine)
        except Exception:
            self._failed_unexpectedly()

    def response_failed(self, engine: CallbackResponse, error: EngineError) -> None:
        if self.done:
            return
        try:
            if self.responded:
                self._break_stream(error)
            elif isinstance(error, EngineTimeout):  # slow, not broken: not sent elsewhere
                self.express.leave(self)
                self._refuse(upstream_timeout(self.served))
            elif error.before_response:
                # The kept connection had been closed by the engine: it never
                # saw the request, and the handler connects afresh.
                self._hand_over(None)
            else:  # an answer broken off
                self._hand_over(str(error))
        except Exception:
            self._failed_unexpectedly()

    # -- how it ends ----------------------------------------------------------
    def _answer(self, engine: CallbackResponse) -> None:
        self.express.leave(self)
        body = b"".join(self.parts)
        status, content_type = engine.status, engine.content_type
        if 400 <= status < 500:  # the engine refused it: the client's error, in OpenAI's shape
            refusal = engine_refusal(self.served, status, body, self.path)
            status, content_type, body = refusal.status, b"application/json", refusal.body()
        self.status = status
        self.responded = True
        self.tail = body
        self.ttft = time.perf_counter() - self.started
        self.cycle.respond(
            status,
            [
                (b"content-type", content_type),
                (b"x-request-id", self.request_id.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
            body,
        )
        self.express.endpoints.record(self)

    def _relay(self, engine: CallbackResponse, body: bytes) -> None:
        cycle = self.cycle
        if not self.responded:  # the first bytes: the answer is this engine's now
            self.responded = True
            self.status = 200
            cycle.start_response(
                200,
                [
                    (b"content-type", engine.content_type),
                    (b"x-request-id", self.request_id.encode()),
                    (b"cache-control", b"no-cache"),
                ],
            )
        usage = self.usage
        chunk = usage.feed(body) if usage is not None else body
        if not chunk:
            return
        cycle.write(chunk, True)
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.started
        self.parts.append(chunk)  # the last two: what the client has last
        if len(self.parts) > 2:
            del self.parts[0]
        if cycle.protocol.flow.write_paused:  # the client is behind: so is the engine
            engine.pause()
            cycle.resumes = engine.resume

    def _end_stream(self) -> None:
        self.express.leave(self)
        usage = self.usage
        rest = usage.flush() if usage is not None else b""
        if rest:
            self.cycle.write(rest, True)
        self.tail = b"".join(self.parts)  # usage, when asked for, is in the last events
        self.cycle.write(b"", False)
        self.express.endpoints.record(self)

    def _break_stream(self, error: EngineError) -> None:
        """Bytes already reached the client: no retry, but no silent cut either."""
        self.express.leave(self)
        self.status = 502
        self.express.gw.metrics.error("upstream_stream_error")
        log.warning("request %s: stream from %s broke: %s", self.request_id, self.pg, error)
        self.tail = b"".join(self.parts)
        self.cycle.write(stream_error_event(f"the model's stream broke: {error}"), False)
        self.express.endpoints.record(self)

    def _too_large(self, engine: CallbackResponse) -> None:
        engine.close()
        self.parts.clear()
        self.express.leave(self)
        self._refuse(
            upstream_failed(
                self.served,
                f"its answer is larger than the {self.express.max_answer} bytes the gateway "
                "relays whole (ask for less, or stream it)",
            )
        )

    def _refuse(self, err: GatewayError) -> None:
        self.status = err.status
        self.responded = True
        self.express.gw.metrics.error(err.code or "error")
        body = err.body()
        self.cycle.respond(err.status, err.head(body, self.request_id), body)
        self.express.endpoints.record(self)

    def _hand_over(self, why: str | None) -> None:
        """The engine failed before any byte reached the client: the handler
        takes the request from the start, as if it had been first; not to this
        replica again when ``why`` says what it did wrong."""
        self.express.leave(self)
        self.cycle.unwatch()
        if why is not None:
            self.express.gw.metrics.error("upstream_retry")
            log.warning("request %s: %s failed before answering: %s", self.request_id, self.pg, why)
            self.cycle.scope[FAILED_AT] = (self.pg, why)
        self.cycle.start()

    def _failed_unexpectedly(self) -> None:
        log.exception("request %s failed unexpectedly", self.request_id)
        self.express.gw.metrics.error("internal_error")
        if self.engine is not None:
            self.engine.close()
        if not self.done:
            self.express.leave(self)
        if self.responded:
            self.cycle.protocol.transport.close()  # an answer cut short: the client must see it
            self.express.endpoints.record(self)
        else:
            self._refuse(internal_error())


class Express:
    """Offered every inference POST whose body is whole (by DirectCycle)."""

    def __init__(self, endpoints: InferenceEndpoints) -> None:
        self.endpoints = endpoints
        self.gw = endpoints.gw
        self.max_answer = endpoints.gw.upstream.max_answer_bytes

    def take(self, cycle: DirectCycle) -> bool:
        """Serve ``cycle``'s request here (True), or leave it, unchanged, to the
        handler (False)."""
        try:
            lane = self._admit(cycle)
        except Exception:  # refused, or a bug: the handler answers it, audited or logged
            return False
        return lane is not None and self._send(lane)

    def _admit(self, cycle: DirectCycle) -> _Lane | None:
        """The handler's checks, changing nothing but the slot it takes; None
        for a request that is not the common kind."""
        gw = self.gw
        if gw.tracing is not None:
            return None
        auth = given_id = given_tags = None
        for name, value in cycle.scope["headers"]:
            if name == b"authorization":
                auth = value
            elif name == b"x-request-id":
                given_id = value
            elif name == b"x-letsinfer-tags":
                given_tags = value
            elif name == b"x-letsinfer-group":  # pinned (or refused): the handler's
                return None
        body = cycle.body
        if len(body) > gw.max_body_bytes:
            return None
        key = authenticate(gw, auth.decode("latin-1") if auth else None)
        if key.limits is not None or key.cache is not None or key.project_scope is not None:
            return None  # (counted or cached: the handler's way)
        kept_tags = None if given_tags is None else tags.parse(given_tags)  # (refused: the handler)
        if key.concurrency is not None and gw.admission.key_in_flight(key.name) >= key.concurrency:
            return None
        path = cycle.scope["path"]
        route = ROUTES[path]
        parsed = protocol.parse(body, route)
        if adapters.FIELD in parsed:
            return None
        entry = gw.directory.current().names.get(parsed["model"])
        if (
            entry is None
            or entry.base is not None
            or entry.external is not None
            or not key.allows(entry.name)
        ):
            return None
        if entry.text_only and route.kind == "chat" and protocol.may_carry_media(body):
            protocol.refuse_media(parsed, entry.name)  # (refused: the handler answers)
        lane = _Lane(request_id_from(given_id), self, cycle)
        lane.key = key.name
        lane.tags = kept_tags
        lane.asked = access_log.loggable(parsed["model"])
        lane.served = entry.name
        lane.endpoint = ENDPOINTS[path]
        lane.path = path
        if parsed.get("stream", False):
            lane.stream = True
            if route.sampling:
                lane.usage, body = stream_usage.counted(body, parsed)
        lane.body = body
        # The slot last: nothing after it can fail.
        lane.replica = gw.admission.take_now(entry.name, self.endpoints.prefix_hint(parsed, route))
        return lane if lane.replica is not None else None

    def _send(self, lane: _Lane) -> bool:
        replica = lane.replica
        assert replica is not None
        gw = self.gw
        try:
            engine = gw.upstream.client.post_on_idle(
                replica.base_url,
                lane.path,
                lane.body,
                lane,
                authorization=replica.authorization,
                extra_headers=(("x-request-id", lane.request_id),),
                hold=replica.in_flight > 1,  # its engine is busy: others will follow
            )
        except Exception:  # (a malformed engine URL: the handler reports it)
            engine = None
        if engine is None:
            gw.admission.release(replica)
            return False
        gw.admission.enter_key(lane.key, None)  # its limit was checked above
        lane.engine = engine
        lane.pg = replica.pg_id
        lane.node = replica.node_id or None
        lane.cycle.watch(lane.client_gone)
        return True

    def leave(self, lane: _Lane) -> None:
        """Give back the lane's slot and its key's count."""
        lane.done = True
        assert lane.replica is not None
        self.gw.admission.leave_key(lane.key)
        self.gw.admission.release(lane.replica)
