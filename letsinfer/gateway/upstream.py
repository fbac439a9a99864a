"""Getting an answer started at some replica, retrying elsewhere while that is safe.

Nothing reaches the client until a replica has produced the first byte of its
answer (the whole answer, when not streaming). Until then, a replica that
refuses the connection, drops it, answers 503 (an engine's), or ends its stream
before any data is skipped, and the request goes to another replica. A replica that is
merely slow is not: a read timeout is a 504, because sending the same work
elsewhere would only double the load. An external provider's 429 or 5xx is
its answer, relayed with its ``Retry-After``, unless the model has a fallback
to send the request to instead. Once the first byte is on its way,
:mod:`letsinfer.gateway.serving` relays the rest and a failure becomes an error
event in the stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from letsinfer.gateway import external
from letsinfer.gateway.adapters import with_lora
from letsinfer.gateway.admission import STANDARD, Admission
from letsinfer.gateway.engine_client import (
    AnswerTooLarge,
    ConnectTimeout,
    EngineClient,
    EngineError,
    EngineResponse,
    EngineTimeout,
)
from letsinfer.gateway.errors import (
    GatewayError,
    engine_refusal,
    upstream_failed,
    upstream_timeout,
)
from letsinfer.gateway.metrics import GatewayMetrics
from letsinfer.gateway.routing import Replica

log = logging.getLogger("letsinfer.gateway")


class Started:
    """An answer under way: the replica holding a slot, and the first bytes.

    ``response`` is None when ``first`` is the whole body. The caller must
    call :meth:`Upstream.finish` exactly once."""

    __slots__ = (
        "content_type",
        "first",
        "queue_s",
        "replica",
        "response",
        "retry_after",
        "status",
    )

    def __init__(
        self,
        replica: Replica,
        status: int,
        content_type: bytes,
        first: bytes,
        response: EngineResponse | None,
        queue_s: float,
        retry_after: bytes | None = None,
    ) -> None:
        self.replica = replica
        self.status = status
        self.content_type = content_type
        self.first = first
        self.response = response
        self.queue_s = queue_s
        self.retry_after = retry_after


class Upstream:
    # [gateway] max_answer_bytes (set by Gateway.build)
    max_answer_bytes = 64 * 1024 * 1024

    def __init__(self, client: EngineClient, admission: Admission, metrics: GatewayMetrics) -> None:
        self.client = client
        self.admission = admission
        self.metrics = metrics

    async def aclose(self) -> None:
        await self.client.aclose()

    async def start(
        self,
        service: str,
        key: str,
        path: str,
        body: bytes,
        *,
        stream: bool,
        request_id: str,
        prefix_hash: int | None,
        band: int = STANDARD,
        adapter: str | None = None,
        failed_at: tuple[str, str] | None = None,
        only: str | None = None,
        fail_on_provider_error: bool = False,
        at_engine: Callable[[Replica | None], None] = lambda replica: None,
        recheck: Callable[[], None] | None = None,
    ) -> Started:
        """``adapter``: a LoRA adapter of ``service`` to apply (only replicas that
        loaded it serve, each told its own id for it); ``failed_at``: a replica
        that already failed this request before any byte reached the client,
        and why (the express lane's), not tried again; ``only``: the one
        group that may take it (letsinfer.gateway.pinning), the others excluded;
        ``fail_on_provider_error``: a provider's 429 or 5xx is raised (for a
        fallback to take), not relayed; ``at_engine``: told of each replica
        the request is sent to, and None when that one did no work on it;
        ``recheck``: called once a slot is held, before anything is sent,
        to refuse (by raising) a request whose key was revoked while it
        waited in the queue."""
        tried: set[str] = set()
        failures: list[str] = []
        if failed_at is not None:
            tried.add(failed_at[0])
            failures.append(f"{failed_at[0]}: {failed_at[1]}")
        held = None
        if only is not None:
            others = self.admission.routing.replicas(service)
            tried.update(r.pg_id for r in others if r.pg_id != only)
            # A group held out of clients' traffic takes only this request.
            held = self.admission.routing.held(service, only)
        queue_s = 0.0
        extra: tuple[tuple[str, str], ...] = (("x-request-id", request_id),)
        while True:
            waited_from = time.perf_counter()
            if held is not None and only not in tried:
                replica = _held_slot(held)
            else:
                replica = await self._acquire(
                    service, key, prefix_hash, frozenset(tried), "; ".join(failures), band, adapter
                )
            queue_s += time.perf_counter() - waited_from
            tried.add(replica.pg_id)
            response: EngineResponse | None = None
            try:
                if recheck is not None:
                    recheck()
                payload, headers = body, extra
                if replica.external is not None:  # a provider: its model name and key
                    payload, headers = external.prepare(replica, body, extra)
                elif adapter is not None:
                    payload = with_lora(body, replica.adapters.index(adapter))
                at_engine(replica)
                response = await self._send(replica, path, payload, headers)
                # An engine loading or overloaded: try another. (A provider's
                # 503 is its answer, with its Retry-After, as its other 5xx are.)
                if response.status == 503 and replica.external is None:
                    raise EngineError("engine answered 503", before_response=True)
                retry_after = None
                if replica.external is not None:
                    if response.status in (401, 403):
                        # The provider refused its key: not the client's key at fault.
                        raise external.refused_key(service, response.status)
                    if external.failed(response.status):
                        if fail_on_provider_error or external.misconfigured(response.status):
                            raise external.provider_failed(service, response.status)
                        retry_after = external.retry_after(response.status, response.retry_after)
                if stream and response.status == 200:
                    first = await response.next_chunk()
                    if first is None:
                        raise EngineError("empty stream", before_response=True)
                    return Started(replica, 200, response.content_type, first, response, queue_s)
                content = await response.read(self.max_answer_bytes)
                if 400 <= response.status < 500 and replica.external is None:
                    # The engine refused it: the client's error, in OpenAI's shape.
                    named = adapter or service  # (an adapter's key is never told its base)
                    refusal = engine_refusal(named, response.status, content, path)
                    return Started(
                        replica,
                        refusal.status,
                        b"application/json",
                        refusal.body(),
                        None,
                        queue_s,
                    )
                return Started(
                    replica,
                    response.status,
                    response.content_type,
                    content,
                    None,
                    queue_s,
                    retry_after,
                )
            except AnswerTooLarge as exc:  # (another replica would write as much)
                self._give_back(replica, response)
                raise upstream_failed(
                    service,
                    f"its answer is larger than the {self.max_answer_bytes} bytes the gateway "
                    "relays whole (ask for less, or stream it)",
                ) from exc
            except EngineError as exc:
                self._give_back(replica, response)
                if isinstance(exc, EngineTimeout) and not isinstance(exc, ConnectTimeout):
                    # Slow, not broken (it may have worked all along): not sent elsewhere.
                    raise upstream_timeout(service) from exc
                # Nothing reached the client yet (a connect timeout: nor the
                # engine): another replica may answer.
                at_engine(None)
                failures.append(f"{replica.pg_id}: {_why(replica, response, exc)}")
                self.metrics.error("upstream_retry")
                log.warning(
                    "request %s: %s failed before answering: %s", request_id, replica.pg_id, exc
                )
                continue
            except BaseException as exc:  # the client left, a provider refused, or a bug
                self._give_back(replica, response)
                if isinstance(exc, GatewayError):
                    at_engine(None)  # the provider did no work (one that was left may have)
                raise

    # The two steps a traced gateway wraps in spans (letsinfer.gateway.tracing);
    # here they hand back the awaitable itself: no extra frame per request.
    def _acquire(
        self,
        service: str,
        key: str,
        prefix_hash: int | None,
        exclude: frozenset[str],
        failures: str,
        band: int,
        adapter: str | None,
    ) -> Awaitable[Replica]:
        return self.admission.acquire(service, key, prefix_hash, exclude, failures, band, adapter)

    def _send(
        self, replica: Replica, path: str, body: bytes, extra: tuple[tuple[str, str], ...]
    ) -> Awaitable[EngineResponse]:
        ext = replica.external
        return self.client.post(
            replica.base_url,
            path,
            body,
            authorization=replica.authorization,
            extra_headers=extra,
            ca_file=None if ext is None else ext.ca_file,
        )

    def _give_back(self, replica: Replica, response: EngineResponse | None) -> None:
        if response is not None:
            response.close()
        self.admission.release(replica)

    def finish(self, started: Started) -> None:
        """End an answer: close the engine exchange (if unfinished, the engine
        sees the connection go and frees its slot) and give the slot back."""
        self._give_back(started.replica, started.response)


def _held_slot(replica: Replica) -> Replica:
    """A slot on a group held out of clients' traffic, for the request pinned
    to it (its only user: it never waits behind clients)."""
    if replica.full:
        raise GatewayError(
            429,
            f"Placement group {replica.pg_id} is busy with the requests pinned to it.",
            type_="rate_limit_error",
            code="group_busy",
        )
    replica.in_flight += 1
    replica.taken += 1
    return replica


def _why(replica: Replica, response: EngineResponse | None, exc: EngineError) -> str:
    """A failure as the client may read it: a provider's address stays in the log
    (an answer's failure names none, a connection's does)."""
    if replica.external is None or response is not None:
        return str(exc)
    return external.unreachable(exc)


__all__ = ["Started", "Upstream", "upstream_failed"]
