"""OpenTelemetry traces of the gateway's requests, for sites that run a
collector. Imported only when ``[tracing] otlp_endpoint`` is set: a gateway
without it loads none of this and pays one attribute check per request.

Per request, one server span (from the client's ``traceparent`` when it sent
one) with two children: ``route`` (choosing a replica, including any wait in
the admission queue when every replica was full) and ``upstream`` per engine
tried (from sending the request to the end of the answer). The engine gets
the upstream span's ``traceparent``, so an engine that traces joins the trace.
Spans leave in batches from the SDK's own thread (OTLP over HTTP). They carry
ids, names, statuses, token counts and times; never prompt or answer text and
never a key secret.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, MutableMapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from letsinfer.config import TracingSettings
from letsinfer.gateway.engine_client import EngineResponse
from letsinfer.gateway.routing import Replica
from letsinfer.gateway.upstream import Upstream

if TYPE_CHECKING:
    from letsinfer.gateway.exchange import Exchange

_PROPAGATOR = TraceContextTextMapPropagator()
# The engine exchange under way in this request's task (ended when its slot goes back).
_upstream: contextvars.ContextVar[trace.Span | None] = contextvars.ContextVar(
    "letsinfer_upstream_span", default=None
)


class Tracing:
    def __init__(self, settings: TracingSettings) -> None:
        assert settings.otlp_endpoint is not None
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        )
        self.exporter = OTLPSpanExporter(endpoint=f"{settings.otlp_endpoint}/v1/traces")
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("letsinfer.gateway")

    async def request(
        self, scope: MutableMapping[str, Any], handle: Coroutine[Any, Any, Exchange]
    ) -> None:
        """Run one request's handling inside its server span."""
        carrier = {
            k.decode(): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in (b"traceparent", b"tracestate")
        }
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"{scope['method']} {scope['path']}", context=parent, kind=SpanKind.SERVER
        )
        token = context.attach(trace.set_span_in_context(span))
        ex = None
        try:
            ex = await handle
        finally:
            context.detach(token)
            if ex is not None:
                _describe(span, ex)
            span.end()

    async def shutdown(self) -> None:
        """Send what is left (off the event loop: it is an HTTP post)."""
        await asyncio.to_thread(self.provider.shutdown)


def _describe(span: trace.Span, ex: Exchange) -> None:
    attributes: dict[str, str | int | float | bool] = {
        "http.response.status_code": ex.status,
        "letsinfer.request_id": ex.request_id,
        "letsinfer.key": ex.key,
        "gen_ai.request.model": ex.asked,
        "letsinfer.model": ex.served,
        "letsinfer.stream": ex.stream,
        "letsinfer.queue_ms": ex.queue_s * 1000,
    }
    if ex.pg != "-":
        attributes["letsinfer.placement_group"] = ex.pg
    if ex.node:
        attributes["letsinfer.node"] = ex.node
    if ex.ttft is not None:
        attributes["letsinfer.ttft_ms"] = ex.ttft * 1000
    prompt, completion = ex.tokens
    if prompt is not None:
        attributes["gen_ai.usage.input_tokens"] = prompt
    if completion is not None:
        attributes["gen_ai.usage.output_tokens"] = completion
    span.set_attributes(attributes)
    if ex.status >= 500:
        span.set_status(Status(StatusCode.ERROR))


class TracedUpstream(Upstream):
    """The upstream with a span around choosing a replica and each engine exchange."""

    def __init__(self, *args: Any, tracing: Tracing) -> None:
        super().__init__(*args)
        self.tracer = tracing.tracer

    async def _acquire(  # type: ignore[override]
        self,
        service: str,
        key: str,
        prefix_hash: int | None,
        exclude: frozenset[str],
        failures: str,
        band: int,
        adapter: str | None,
    ) -> Replica:
        with self.tracer.start_as_current_span("route") as span:
            span.set_attribute("letsinfer.model", service)
            replica = await super()._acquire(
                service, key, prefix_hash, exclude, failures, band, adapter
            )
            span.set_attribute("letsinfer.placement_group", replica.pg_id)
            if replica.node_id:
                span.set_attribute("letsinfer.node", replica.node_id)
            return replica

    async def _send(  # type: ignore[override]
        self, replica: Replica, path: str, body: bytes, extra: tuple[tuple[str, str], ...]
    ) -> EngineResponse:
        span = self.tracer.start_span(
            "upstream",
            kind=SpanKind.CLIENT,
            attributes={"letsinfer.placement_group": replica.pg_id, "url.path": path},
        )
        _upstream.set(span)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        try:
            response = await super()._send(replica, path, body, (*extra, *carrier.items()))
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            raise
        span.set_attribute("http.response.status_code", response.status)
        return response

    def _give_back(self, replica: Replica, response: EngineResponse | None) -> None:
        super()._give_back(replica, response)
        span = _upstream.get()
        if span is not None:
            _upstream.set(None)
            span.end()
