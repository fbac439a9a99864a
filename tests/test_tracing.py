"""Opt-in tracing: with an OTLP endpoint set, a span per request (route and
upstream inside it) reaches the collector, and the engine gets a traceparent
that joins the trace; without one, OpenTelemetry's SDK is never loaded."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from benchmarks.mock_upstream import MockBehaviour
from letsinfer.config import TracingSettings
from tests.gateway_harness import MODEL, GatewayHarness

trace_service = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="the tracing extra is not installed",
)


class Collector:
    """A local OTLP/HTTP receiver: records what is POSTed to /v1/traces."""

    def __init__(self) -> None:
        self.posts: list[bytes] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.path == "/v1/traces":
                    posts.append(body)
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[object]:
        out = []
        for body in self.posts:
            request = trace_service.ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    out.extend(scope.spans)
        return out


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    try:
        yield c
    finally:
        c.server.shutdown()


def attrs(span: object) -> dict[str, object]:
    out = {}
    for kv in span.attributes:  # type: ignore[attr-defined]
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_a_traced_request_reaches_the_collector_and_the_engine_joins(
    tmp_path: Path, collector: Collector
) -> None:
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    client_span = "00f067aa0ba902b7"
    prompt = "a secret question nobody may read"
    settings = TracingSettings(otlp_endpoint=collector.url, service_name="gw-under-test")
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=3)}, tracing=settings) as h:
        auth = {"authorization": f"Bearer {h.keys['alice']}"}
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
        r = httpx.post(
            h.url + "/v1/chat/completions",
            json=body,
            headers={
                **auth,
                "x-request-id": "traced-1",
                "traceparent": f"00-{client_trace}-{client_span}-01",
            },
        )
        assert r.status_code == 200
        with httpx.stream(
            "POST", h.url + "/v1/chat/completions", json={**body, "stream": True}, headers=auth
        ) as s:
            assert s.status_code == 200 and b"[DONE]" in s.read()
        engine_saw = list(h.mocks["pg-a"].stats.traceparents)
    # Leaving the harness shut the gateway down, which sends the last spans.
    spans = collector.spans()
    server = [s for s in spans if attrs(s).get("letsinfer.request_id") == "traced-1"]
    assert len(server) == 1, [s.name for s in spans]
    root = server[0]
    assert root.trace_id.hex() == client_trace and root.parent_span_id.hex() == client_span
    assert root.name == "POST /v1/chat/completions"
    a = attrs(root)
    assert a["http.response.status_code"] == 200 and a["letsinfer.key"] == "alice"
    assert a["letsinfer.placement_group"] == "pg-a" and a["gen_ai.usage.output_tokens"] == 3
    children = {s.name: s for s in spans if s.parent_span_id == root.span_id}
    assert set(children) == {"route", "upstream"}
    assert attrs(children["route"])["letsinfer.placement_group"] == "pg-a"
    upstream = children["upstream"]
    assert attrs(upstream)["http.response.status_code"] == 200
    # The engine got the upstream span as its parent, in the client's trace.
    assert f"00-{client_trace}-{upstream.span_id.hex()}-01" in engine_saw
    # The streamed request has its own trace, with its own spans, and never any text.
    assert len({s.trace_id for s in spans}) == 2 and len(engine_saw) == 2
    assert all(prompt.encode() not in post for post in collector.posts)
    assert all(h.keys["alice"].encode() not in post for post in collector.posts)


def test_without_an_endpoint_opentelemetry_is_never_loaded(tmp_path: Path) -> None:
    probe = f"""
import json, sys
from pathlib import Path
from letsinfer import config
from letsinfer.node import MainNode
from letsinfer.gateway.app import create_app
from letsinfer.gateway.directory import Directory
from letsinfer.gateway.gateway import Gateway
from letsinfer.gateway.routing import RoutingTable
from letsinfer.store import AuthorityStore
settings = config.load(Path("/nonexistent"), {{}})
gw = Gateway.build(Directory(AuthorityStore(Path({str(tmp_path / "a.db")!r}))), RoutingTable(),
                   settings.gateway, tracing=settings.tracing)
create_app(gw)
print(json.dumps([gw.tracing is None, sorted(m for m in sys.modules
                  if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter",
                                   "letsinfer.gateway.tracing")))]))
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == [True, []]


def test_tracing_without_the_extra_is_refused_with_the_fix(tmp_path: Path) -> None:
    probe = f"""
import sys
sys.modules["opentelemetry.sdk"] = None  # as if the extra were not installed
from pathlib import Path
from letsinfer.config import ConfigError, TracingSettings
from letsinfer.gateway.directory import Directory
from letsinfer.gateway.gateway import Gateway
from letsinfer.gateway.routing import RoutingTable
from letsinfer.store import AuthorityStore
try:
    Gateway.build(Directory(AuthorityStore(Path({str(tmp_path / "a.db")!r}))), RoutingTable(),
                  tracing=TracingSettings(otlp_endpoint="http://127.0.0.1:9"))
except ConfigError as exc:
    print(exc)
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert "pip install 'letsinfer[tracing]'" in out
