"""The inference endpoints: one handler, reached through the gateway's own
HTTP path (letsinfer.gateway.direct) or over ASGI, with ASGI's receive and
send either way.

Every completion and embedding request takes this path, so it stays lean:
headers are read once from the scope, the body is checked by the wire
models and forwarded as the client's own bytes, and the engine's stream is
passed through chunk by chunk without being parsed. Once the body is read
the client connection is watched: if it goes away, the request is cancelled,
which closes the connection to the engine so its slot frees at once.

Each request gets one access-log line, one metrics update and, when the
node keeps them, one request record (handed to a background writer: no
database write here), booked together with the other requests that finish
in the same turn of the event loop. Streamed answers get their token counts
from the engine's usage event, asked for on the client's behalf when it did
not ask and then taken out of its stream (letsinfer.gateway.stream_usage).

What a key or a model may add, each behind one attribute check so that a
request that uses none of it pays nothing more: the key's rate limits and
budget (letsinfer.gateway.limits), its response cache
(letsinfer.gateway.cache), its priority band (the admission queue), a LoRA
adapter named as the model (letsinfer.gateway.adapters), and the model's
fallback when none of its groups can take the request (the answer says so in
``x-letsinfer-fallback``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from letsinfer.gateway import access_log, adapters, cache, policy, protocol, stream_usage, tags
from letsinfer.gateway.booking import Booking
from letsinfer.gateway.directory import KeyPolicy, ServiceEntry, StoreUnavailable
from letsinfer.gateway.engine_client import EngineError
from letsinfer.gateway.errors import (
    GatewayError,
    internal_error,
    invalid_key,
    missing_key,
    unknown_model,
)
from letsinfer.gateway.exchange import (
    CLIENT_GONE,
    Exchange,
    answers_as,
    renamed,
    request_id_from,
    stream_error_event,
)
from letsinfer.gateway.gateway import Gateway
from letsinfer.gateway.limits import estimate_prompt
from letsinfer.gateway.pinning import pinned_group
from letsinfer.gateway.upstream import Started

log = logging.getLogger("letsinfer.gateway")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

ROUTES: dict[str, protocol.Route] = {
    "/v1/chat/completions": protocol.CHAT,
    "/v1/completions": protocol.COMPLETION,
    "/v1/embeddings": protocol.EMBEDDING,
}

# Refusals of a key's use that land in the audit chain (never the key itself).
_AUDITED = frozenset({"invalid_api_key", "concurrency_limit_exceeded", "group_pin_refused"})

# Why a model's own groups could not take a request that its fallback then gets:
# none will serve (parked, stopped, not placed), none is ready now (or every one
# failed before its first byte: an external provider's refusing the gateway's
# key, a key file that cannot be read, or a provider's 429 or 5xx included), or
# all stayed full past the queue's bounds. (A slow engine's timeout does not: it
# may be working.)
FALLBACK_ON = frozenset(
    {
        "model_parked",
        "model_stopped",
        "model_not_placed",
        "no_healthy_replica",
        "provider_refused_key",
        "provider_key_unreadable",
        "provider_failed",
        "queue_full",
        "queue_timeout",
    }
)

# In a request's scope: the replica that failed it in the express lane and
# why (letsinfer.gateway.express), so the retry here goes elsewhere.
FAILED_AT = "letsinfer.failed_at"

# A stream that waits for its model to load opens after this long, then says
# so every as long (keeps clients and proxies from timing out an idle stream).
LOAD_NOTE_S = 2.0

# How request records name the endpoints.
ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}


# Watches for the client leaving once its request's body is read: calls its
# argument if it does, and returns what stops watching.
Watch = Callable[[Callable[[], None]], Callable[[], object]]


def _asgi_watch(receive: Receive) -> Watch:
    """Over ASGI: a message after the body is complete can only be the client leaving."""

    def watch(gone: Callable[[], None]) -> Callable[[], object]:
        waiter = asyncio.ensure_future(receive())

        def on_message(done: asyncio.Future[MutableMapping[str, Any]]) -> None:
            if (
                not done.cancelled()
                and done.exception() is None
                and done.result().get("type") == "http.disconnect"
            ):
                gone()

        waiter.add_done_callback(on_message)
        return waiter.cancel

    return watch


class ClientGone(Exception):
    """The client closed its connection before its request was complete."""


def authenticate(gw: Gateway, header: str | None) -> KeyPolicy:
    if not header:
        raise missing_key()
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise missing_key()
    try:
        key = gw.directory.key_for(secret)
    except StoreUnavailable as exc:
        raise GatewayError(
            503,
            "The gateway cannot check API keys right now (authority "
            "store unavailable); retry shortly.",
            type_="service_unavailable",
            code="authority_unavailable",
            headers={"retry-after": "2"},
        ) from exc
    if key is None:
        raise invalid_key()
    return key


def note_refusal(gw: Gateway, scope: Scope, key_name: str, err: GatewayError) -> None:
    """Count a refused use of a key (never the key itself) for the audit chain:
    by key when it was known, else by the client's address."""
    if err.code not in _AUDITED:
        return
    client = scope.get("client") or ("?",)
    who = f"key:{key_name}" if key_name != "-" else f"client:{client[0]}"
    gw.denials.note(who, "gateway.request", err.code or "")


def count_refusal(gw: Gateway, scope: Scope, err: GatewayError) -> None:
    """A refused request on a route other than the inference POSTs (``GET
    /v1/models``, ``/health`` with a bad key): counted in metrics and written to
    the access log like theirs (at the refusals' rate, see access_log)."""
    gw.metrics.error(err.code or "error")
    gw.metrics.request("-", err.status, 0.0, None)
    given = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
    access_log.refusal(request_id_from(given), err.status, str(scope["path"]))


def too_large(limit: int) -> GatewayError:
    return GatewayError(
        413, f"Request body is larger than the limit of {limit} bytes.", code="request_too_large"
    )


async def read_body(receive: Receive, declared: bytes | None, limit: int) -> bytes:
    if declared is not None:
        if not declared.isdigit():
            raise GatewayError(400, "Invalid Content-Length header.")
        if int(declared) > limit:
            raise too_large(limit)
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body"):
        if message["type"] == "http.disconnect":
            raise ClientGone
        if len(body) > limit:
            raise too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while message.get("more_body"):
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


class InferenceEndpoints:
    """POST /v1/chat/completions, /v1/completions and /v1/embeddings."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.prefix_chars = gw.policy.affinity_prefix_chars if gw.policy.affinity else 0
        self.record = Booking(gw).record  # settles and books each finished request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Over ASGI (the gateway's own connections take letsinfer.gateway.direct)."""
        await self.serve(scope, receive, send, _asgi_watch(receive))

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        watch: Watch,
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        """One request; ``task``: the one running it (when the caller has it at hand)."""
        handle = self._handle(scope, receive, send, watch, task or asyncio.current_task())
        tracing = self.gw.tracing
        if tracing is None:
            await handle
        else:
            await tracing.request(scope, handle)

    async def _handle(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        watch: Watch,
        task: asyncio.Task[Any] | None,
    ) -> Exchange:
        auth = given_id = declared = cache_control = given_tags = pin = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value
            elif name == b"x-request-id":
                given_id = value
            elif name == b"content-length":
                declared = value
            elif name == b"x-letsinfer-tags":
                given_tags = value
            elif name == b"x-letsinfer-group":
                pin = value
            elif name == b"cache-control":  # (every line of it: HTTP joins them)
                cache_control = value if cache_control is None else cache_control + b"," + value
        ex = Exchange(request_id_from(given_id), task)
        unwatch: Callable[[], None] | None = None
        try:
            key = authenticate(self.gw, auth.decode("latin-1") if auth else None)
            ex.key = key.name
            if given_tags is not None:
                ex.tags = tags.parse(given_tags)
            body = await read_body(receive, declared, self.gw.max_body_bytes)
            unwatch = watch(ex.client_gone)
            await self._serve(
                scope["path"], key, body, ex, send, cache_control, scope.get(FAILED_AT), pin
            )
        except GatewayError as err:
            ex.status = err.status
            if err.code == "upstream_timeout":  # the engine may have worked all along
                ex.cut_off = True
            self.gw.metrics.error(err.code or "error")
            note_refusal(self.gw, scope, ex.key, err)
            ex.done = True
            await err.send(send, ex.request_id)
        except ClientGone:
            ex.status = CLIENT_GONE
            self.gw.metrics.error("client_disconnected")
        except asyncio.CancelledError:
            if not ex.gone:
                raise
            if ex.task is not None:
                ex.task.uncancel()
            if not (ex.status == 200 and ex.tail.rstrip().endswith(b"data: [DONE]")):
                # (A client that leaves once it has [DONE] has the whole answer.)
                ex.status = CLIENT_GONE
                ex.cut_off = True
                self.gw.metrics.error("client_disconnected")
        except Exception:
            log.exception("request %s failed unexpectedly", ex.request_id)
            self.gw.metrics.error("internal_error")
            if not ex.responded:
                ex.status = 500
                ex.done = True
                await internal_error().send(send, ex.request_id)
        finally:
            ex.done = True
            if unwatch is not None:
                unwatch()
            self.record(ex)
        return ex

    async def _serve(
        self,
        path: str,
        key: KeyPolicy,
        body: bytes,
        ex: Exchange,
        send: Send,
        cache_control: bytes | None = None,
        failed_at: tuple[str, str] | None = None,
        pin: bytes | None = None,
    ) -> None:
        gw = self.gw
        ex.endpoint = ENDPOINTS[path]
        route = ROUTES[path]
        parsed = protocol.parse(body, route)
        ex.asked = access_log.loggable(parsed["model"])
        if adapters.FIELD in parsed:
            raise adapters.client_lora()
        entry = gw.directory.current().names.get(parsed["model"])
        if entry is None or not key.allows(entry.name):
            if entry is not None:  # exists, but not for this key: audited, same answer
                gw.denials.note(
                    f"key:{key.name}",
                    "gateway.request",
                    f"model {entry.name} is not in the key's allowlist",
                )
            raise unknown_model(parsed["model"])
        if entry.text_only and route.kind == "chat" and protocol.may_carry_media(body):
            protocol.refuse_media(parsed, entry.name)
        only = None if pin is None else pinned_group(pin, key.name, entry.serves, gw.routing)
        ex.served = entry.name
        ex.renamed = answers_as(entry)
        ex.stream = stream = parsed.get("stream", False)
        if key.limits is not None:
            if gw.recounting:
                await gw.counted(key.name)
            limits = gw.limits_of(key.name)  # (changed, perhaps, since its key was read)
            if limits is not None:
                ex.admitted = gw.limiter.admit(
                    key.name,
                    limits,
                    estimate_prompt(body),
                    protocol.completion_limit(parsed) if route.sampling else None,
                )
        if key.project_scope is not None:  # its project's limits, shared by all its keys
            await self._admit_project(key.project_scope, body, parsed, route, ex)
        if key.cache is not None:
            if self._stopped(entry):  # never answered from the cache (its fallback may answer)
                ex.cache = cache.BYPASS
            elif await self._from_cache(key, entry, path, route, parsed, ex, send, cache_control):
                return
        if stream and route.sampling:
            ex.usage, body = stream_usage.counted(body, parsed)
        hint = self.prefix_hint(parsed, route)
        gw.admission.enter_key(key.name, key.concurrency)
        try:
            try:
                starting = gw.upstream.start(
                    entry.serves,
                    key.name,
                    path,
                    body,
                    stream=stream,
                    request_id=ex.request_id,
                    prefix_hash=hint,
                    band=key.band,
                    adapter=entry.name if entry.base is not None else None,
                    failed_at=failed_at,
                    only=only,
                    fail_on_provider_error=entry.fallback is not None,
                    at_engine=ex.at_engine,
                    recheck=functools.partial(self._not_revoked, key),
                )
                cold = entry.scaling is not None and not gw.routing.ready_count(entry.serves)
                if stream and cold:
                    # A model loaded on demand: the stream opens now and says
                    # it waits (SSE comments, which OpenAI clients skip).
                    loaded = await self._while_loading(starting, entry, ex, send)
                    if loaded is None:  # refused after the stream had opened: said in it
                        ex.load_wait = time.perf_counter() - ex.started
                        return
                    started = loaded
                else:
                    started = await starting
                if cold:  # (only a request that found its model unloaded pays for this)
                    ex.load_wait = started.queue_s
            except GatewayError as err:
                if cold:  # its load failed, or its wait ran out: how long it waited
                    ex.load_wait = time.perf_counter() - ex.started
                if entry.base is not None and not key.allows(entry.base):
                    err = adapters.told_as(entry.name, err)
                if entry.fallback is None or err.code not in FALLBACK_ON or only is not None:
                    raise err from None
                started = await self._fall_back(entry, key, path, body, ex, hint, err)
            ex.queue_s = started.queue_s
            try:
                await self._answer(started, ex, send)
            finally:
                gw.upstream.finish(started)
        finally:
            gw.admission.leave_key(key.name)

    async def _admit_project(
        self, scope: str, body: bytes, parsed: dict[str, Any], route: Any, ex: Exchange
    ) -> None:
        gw = self.gw
        if gw.recounting:
            await gw.counted(scope)
        limits = gw.limits_of(scope)
        if limits is not None:
            ex.project_admitted = gw.limiter.admit(
                scope,
                limits,
                estimate_prompt(body),
                protocol.completion_limit(parsed) if route.sampling else None,
            )

    async def _while_loading(
        self, starting: Awaitable[Started], entry: ServiceEntry, ex: Exchange, send: Send
    ) -> Started | None:
        """Wait for a load with the stream open: its head once the wait passes
        ``LOAD_NOTE_S``, then a comment line every ``LOAD_NOTE_S``. A refusal
        before the head is raised as usual; after it, it is the stream's error
        event (None)."""
        task = asyncio.ensure_future(starting)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=LOAD_NOTE_S)
                if done:
                    break
                if not ex.responded:
                    ex.responded, ex.status, ex.head_sent = True, 200, True
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 200,
                            "headers": [
                                (b"content-type", b"text/event-stream"),
                                (b"x-request-id", ex.request_id.encode()),
                                (b"cache-control", b"no-cache"),
                            ],
                        }
                    )
                note = f": waiting for model {entry.name} to load\n\n".encode()
                await send({"type": "http.response.body", "body": note, "more_body": True})
        except BaseException:
            task.cancel()
            raise
        try:
            return task.result()
        except GatewayError as err:
            if not ex.head_sent:
                raise
            ex.status = err.status
            ex.done = ex.cut_off = True
            body = stream_error_event(err.message, err.code) + b"data: [DONE]\n\n"
            await send({"type": "http.response.body", "body": body})
            return None

    def _not_revoked(self, key: KeyPolicy) -> None:
        """A request that waited in the queue is refused if its key was revoked
        meanwhile: a revocation holds from the moment its command returns."""
        if key.digest not in self.gw.directory.current().keys:
            raise invalid_key()

    def _stopped(self, entry: ServiceEntry) -> bool:
        """Stopped by an administrator (the cluster, the model, or an adapter's
        base): nothing answers under its name, not even the cache."""
        snapshot = self.gw.directory.current()
        serves = snapshot.names.get(entry.serves)
        return snapshot.system_stopped or (
            serves is not None and serves.groups > 0 and not serves.running
        )

    def prefix_hint(self, parsed: protocol.Body, route: protocol.Route) -> int | None:
        """The request's prompt-prefix hash for cache-aware routing (None: off or short)."""
        if not self.prefix_chars:
            return None
        start = protocol.prompt_start(parsed, route.kind, self.prefix_chars)
        return policy.prefix_hash(start, self.gw.policy)

    async def _fall_back(
        self,
        entry: ServiceEntry,
        key: KeyPolicy,
        path: str,
        body: bytes,
        ex: Exchange,
        hint: int | None,
        err: GatewayError,
    ) -> Started:
        """None of the model's groups can take the request: its fallback answers
        (allowed or not to the key: the allowlist applies to the model asked
        for). One hop: the fallback's own fallback is not followed."""
        assert entry.fallback is not None
        other = self.gw.directory.current().names.get(entry.fallback)
        if other is None or other.name == entry.name:
            raise err
        log.info(
            "request %s: model %s cannot take it (%s); its fallback %s answers",
            ex.request_id,
            entry.name,
            err.code,
            other.name,
        )
        ex.fallback = ex.served = other.name
        ex.renamed = answers_as(other)
        try:
            return await self.gw.upstream.start(
                other.serves,
                key.name,
                path,
                body,
                stream=ex.stream,
                request_id=ex.request_id,
                prefix_hash=hint,
                band=key.band,
                adapter=other.name if other.base is not None else None,
                fail_on_provider_error=True,  # (its error is not for this client)
                at_engine=ex.at_engine,
                recheck=functools.partial(self._not_revoked, key),
            )
        except GatewayError as failed:
            # The client hears of the model it asked for, not of one its key
            # may not name (nor of a provider's address).
            log.warning(
                "request %s: the fallback %s of %s failed too: %s",
                ex.request_id,
                other.name,
                entry.name,
                failed.message,
            )
            if failed.code == "upstream_timeout":
                # Its engine worked on it: charged as cut off, and booked where it ran.
                ex.cut_off = True
            else:
                ex.fallback, ex.served = None, entry.name
            raise err from failed

    async def _from_cache(
        self,
        key: KeyPolicy,
        entry: ServiceEntry,
        path: str,
        route: protocol.Route,
        parsed: protocol.Body,
        ex: Exchange,
        send: Send,
        cache_control: bytes | None,
    ) -> bool:
        """Answer from the key's cache (True), or note whether and where the
        engine's answer is to be kept."""
        assert key.cache is not None
        embedding = route.kind == "embedding"
        temperature = None if embedding else parsed.get("temperature")
        if not cache.eligible(key.cache, parsed.get("stream", False), temperature, embedding):
            ex.cache = cache.BYPASS
            return False
        ex.cache_key = cache.cache_key(key.digest, path, entry.name, entry.identity, parsed)
        asked = cache.directives(cache_control)
        if b"no-store" in asked:  # fresh from the engine, and not kept
            ex.cache, ex.cache_key = cache.BYPASS, None
            return False
        if b"no-cache" in asked:  # fresh from the engine; kept for the next one
            ex.cache = cache.BYPASS
            return False
        hit = self.gw.cache.get(ex.cache_key, key.cache.ttl_s)
        if hit is None:
            ex.cache = cache.MISS
            return False
        ex.cache = cache.HIT
        ex.cache_key = None
        ex.status = 200
        ex.responded = True
        headers = [
            (b"content-type", hit.content_type),
            (b"x-request-id", ex.request_id.encode()),
            (b"x-letsinfer-cache", cache.HIT),
            (b"content-length", str(len(hit.body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        ex.ttft = time.perf_counter() - ex.started
        ex.done = True
        await send({"type": "http.response.body", "body": hit.body})
        return True

    async def _answer(self, started: Started, ex: Exchange, send: Send) -> None:
        headers = [
            (b"content-type", started.content_type),
            (b"x-request-id", ex.request_id.encode()),
        ]
        if ex.fallback is not None:
            headers.append((b"x-letsinfer-fallback", ex.fallback.encode()))
        if ex.cache is not None:
            headers.append((b"x-letsinfer-cache", ex.cache))
        ex.status = started.status
        ex.responded = True
        if ex.head_sent:  # the stream opened while its model loaded
            await self._answer_opened(started, ex, send)
            return
        if started.response is None:  # the whole answer is here
            answer = started.first
            if ex.renamed is not None:
                answer = renamed(answer, ex.renamed)
            # (A fallback's answer is not kept: a hit would hide that it was one.)
            if ex.cache_key is not None and started.status == 200 and ex.fallback is None:
                self.gw.cache.put(ex.cache_key, answer, started.content_type)
            if started.retry_after is not None:  # a provider's own 429 or 5xx
                headers.append((b"retry-after", started.retry_after))
            headers.append((b"content-length", str(len(answer)).encode()))
            await send(
                {"type": "http.response.start", "status": started.status, "headers": headers}
            )
            ex.ttft = time.perf_counter() - ex.started
            ex.tail = answer
            ex.done = True
            await send({"type": "http.response.body", "body": answer})
            return
        headers.append((b"cache-control", b"no-cache"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await self._relay(started, ex, send)

    async def _answer_opened(self, started: Started, ex: Exchange, send: Send) -> None:
        """The answer to a stream whose head went out while its model loaded."""
        if started.response is not None:
            await self._relay(started, ex, send)
            return
        # A whole answer (an engine's refusal) in an open stream: its error event.
        ex.status, ex.done, ex.tail = started.status, True, started.first
        message = f"the model answered {started.status}: {started.first[:300]!r}"
        body = stream_error_event(message) + b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": body})

    async def _relay(self, started: Started, ex: Exchange, send: Send) -> None:
        chunk: bytes | None = started.first
        last = before = b""
        response = started.response
        usage = ex.usage
        try:
            while chunk is not None:
                if usage is not None:
                    chunk = usage.feed(chunk)  # (whole events)
                if chunk and ex.renamed is not None:
                    chunk = renamed(chunk, ex.renamed)
                if chunk:
                    if ex.admitted is not None:  # tokens sent, should its usage never come
                        ex.admitted.events += chunk.count(b"data:")
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if ex.ttft is None:
                        ex.ttft = time.perf_counter() - ex.started
                    before = last
                    ex.tail = last = chunk  # what the client has last, should it leave
                chunk = await response.next_chunk()
            rest = b""
            if usage is not None and (rest := usage.flush()):
                if ex.renamed is not None:
                    rest = renamed(rest, ex.renamed)
                await send({"type": "http.response.body", "body": rest, "more_body": True})
            # A provider whose stream ends cleanly but early (a proxy of its own
            # cut off, a crash behind it) must not pass for a whole answer.
            if started.replica.external is not None and not (
                (before + last + rest).rstrip().endswith(b"data: [DONE]")
            ):
                raise EngineError("it ended without [DONE]", before_response=False)
        except EngineError as exc:
            # Bytes already reached the client: no retry, but no silent cut either.
            ex.status = 502
            ex.cut_off = True
            self.gw.metrics.error("upstream_stream_error")
            log.warning("request %s: stream from %s broke: %s", ex.request_id, ex.pg, exc)
            ex.done = True
            await send(
                {
                    "type": "http.response.body",
                    "body": stream_error_event(f"the model's stream broke: {exc}"),
                }
            )
            return
        ex.tail = before + last  # usage, when asked for, is in the last data events
        ex.done = True
        await send({"type": "http.response.body", "body": b""})
