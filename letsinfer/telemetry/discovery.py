"""Prometheus HTTP service discovery
(https://prometheus.io/docs/prometheus/latest/http_sd/), served at ``/sd`` on
the main's metrics listener beside ``/metrics``, under the same exposure rules
(loopback, or the ``metrics_allow`` networks).

It lists one target group per active node, main and children. Only the main
has a metrics listener (a child's engines' ``/metrics`` need their per-replica
key and are firewalled to the main): the main makes every node's series from
its signed facts, each with a ``node`` label. So every target is the main's
listener, at the address and port the asking Prometheus reached it on (right
whatever ``metrics_host`` binds, unspecified addresses too), with
``__param_node``: Prometheus scrapes ``/metrics?node=NAME``, which serves that
node's share of the samples (letsinfer.telemetry.per_node), and the targets
differ by their URL. ``instance`` is the node's name, so the targets'
``up`` and every series stay apart without relabelling.

The other labels are ``__meta_letsinfer_*``, the convention for discovered
labels: Prometheus offers them to ``relabel_configs`` and drops them after, so
each reaches the stored series only if the operator keeps it.

Built from the main's in-memory view of its nodes (refreshed from the
authority every reconcile round, at most every 2 s): no database read, no
cache of its own. Nothing here is on the gateway's request path.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, make_asgi_app

from letsinfer.telemetry.per_node import NodeSamples, node_filter
from letsinfer.telemetry.view import NodeSample

PATH = "/sd"
NODE_PARAM = "node"  # /metrics?node=NAME: that node's target

TargetGroup = dict[str, Any]  # {"targets": ["host:port"], "labels": {...}}
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def target_groups(nodes: Iterable[NodeSample], host: str, port: int) -> list[TargetGroup]:
    """One target per active node among ``nodes`` (by name), each the
    listener at ``host``:``port`` scraped with ``?node=NAME``."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    groups: list[TargetGroup] = []
    for n in sorted(nodes, key=lambda n: n.name):
        if n.state != "active":
            continue
        names = [str(g.get("name", "")) for g in n.gpus]
        labels = {
            "__meta_letsinfer_node": n.name,
            "__meta_letsinfer_role": n.role,
            "__meta_letsinfer_gpus": str(len(n.gpus)),
            # Separators at both ends (as Prometheus's own SDs list tags), so
            # a relabel regex such as .*,NVIDIA H200,.* matches one name.
            "__meta_letsinfer_gpu_names": f",{','.join(names)}," if names else "",
            f"__param_{NODE_PARAM}": n.name,  # a URL parameter of the scrape
            "instance": n.name,
        }
        groups.append({"targets": [address], "labels": labels})
    return groups


def with_discovery(
    metrics_app: ASGIApp,
    registry: CollectorRegistry,
    nodes: Callable[[], Sequence[NodeSample]],
) -> ASGIApp:
    """``metrics_app`` (``registry``'s exposition) with ``PATH`` answering
    the target groups of ``nodes()`` at the listener the request reached, as
    JSON, and a scrape with ``?node=NAME`` answering that node's samples (404
    for a name no active node has). Any other request is ``metrics_app``'s,
    unchanged."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await metrics_app(scope, receive, send)
            return
        if scope["path"] == PATH:
            if scope["method"] != "GET":
                await _answer(send, 405, b'{"error": "only GET"}', [(b"allow", b"GET")])
                return
            host, port = scope["server"]
            body = json.dumps(target_groups(nodes(), host, port)).encode()
            await _answer(send, 200, body, [])
            return
        wanted = parse_qs(
            scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
        ).get(NODE_PARAM)
        if wanted is None:
            await metrics_app(scope, receive, send)
            return
        name = wanted[0]
        keep = node_filter(nodes(), name)
        if keep is None:
            reason = f"no active node named {name[:64]!r}\n".encode()
            await _answer(send, 404, reason, [], b"text/plain; charset=utf-8")
            return
        # Negotiation (text or OpenMetrics, gzip) as for plain /metrics.
        await make_asgi_app(registry=NodeSamples(registry, keep))(scope, receive, send)

    return app


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    extra: list[tuple[bytes, bytes]],
    content_type: bytes = b"application/json",
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
