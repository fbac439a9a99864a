"""What ships for Prometheus and Grafana (monitoring/): the alert rules pass
promtool's checks and unit tests, and every dashboard query names series the
main's metrics endpoint really exports. A real cluster's scrape, and a
stopped model firing the no-ready-group rule, are in test_cluster_serving.py."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest, make_asgi_app
from prometheus_client.parser import text_string_to_metric_families

from letsinfer.gateway.admission import Admission, AdmissionLimits
from letsinfer.gateway.metrics import GatewayMetrics
from letsinfer.gateway.policy import RoutingPolicy
from letsinfer.gateway.routing import Replica, RoutingTable
from letsinfer.telemetry.collector import ClusterCollector
from letsinfer.telemetry.discovery import ASGIApp, with_discovery
from letsinfer.telemetry.view import ClusterView, GroupSample, NodeSample

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "monitoring"
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)


def scrape_text() -> str:
    """The main's registry as node.py wires it, with one node, GPU, group and
    request, scraped through prometheus_client's own exposition."""
    registry, _ = main_registry()
    return generate_latest(registry).decode()


def main_registry(clock: Callable[[], float] = time.time) -> tuple[CollectorRegistry, ClusterView]:
    """The main's registry as node.py wires it, and its view of the cluster:
    one node (n1) with a GPU and two groups, one request."""
    routing = RoutingTable()
    admission = Admission(routing, RoutingPolicy(), AdmissionLimits())
    metrics = GatewayMetrics(routing, admission)
    view = ClusterView(store=None)  # type: ignore[arg-type]  # filled by hand below
    now = clock()
    view.nodes = (
        NodeSample(
            "id-n1",
            "n1",
            "child",
            "active",
            False,
            now - 2,
            now + 86400 * 20,
            True,
            None,
            (
                {
                    "uuid": "GPU-a",
                    "memory_total": 8,
                    "memory_free": 4,
                    "temperature_c": 50,
                    "power_w": 100.0,
                    "utilization": 40,
                },
            ),
        ),
    )
    view.groups = (
        GroupSample("pg-1", "chat", "n1", "running", "ready", 1, None),
        GroupSample("pg-2", "chat", "n1", "running", "parked", 5, "failed to start 5 times"),
    )
    view.models = ("chat",)
    routing.publish(Replica("pg-1", "chat", "http://engine", "Bearer x", 4, "id-n1"))
    metrics.registry.register(ClusterCollector(view, routing, clock=clock))
    metrics.request(
        "chat", 200, 0.5, 0.1, key="team-a", pg="pg-1", prompt_tokens=7, completion_tokens=9
    )
    metrics.error("queue_full")
    return metrics.registry, view


def sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@needs_promtool
def test_promtool_checks_and_unit_tests_the_shipped_rules() -> None:
    check = subprocess.run(
        ["promtool", "check", "rules", str(MONITORING / "alerts.yml")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 9 rules found" in check.stdout
    tested = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yml"],
        capture_output=True,
        text=True,
        cwd=MONITORING,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_and_dashboard_query_reads_series_the_scrape_has() -> None:
    text = scrape_text()
    names = sample_names(text)
    # states pass through as the store has them, bounded labels only
    assert 'letsinfer_group_state{desired="running",model="chat",node="n1",pg="pg-2",' in text
    assert 'state="parked"} 1.0' in text
    assert 'letsinfer_key_tokens_total{key="team-a",kind="completion"} 9.0' in text
    assert 'letsinfer_group_free_slots{model="chat",pg="pg-1"} 4.0' in text
    assert 'letsinfer_model_ready_groups{model="chat"} 1.0' in text

    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert dashboard["title"] == "letsinfer" and dashboard["uid"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert all(p["targets"] and "gridPos" in p for p in panels)
    rules = (MONITORING / "alerts.yml").read_text()
    used = {m for e in [*exprs, rules] for m in re.findall(r"\bletsinfer_[a-z0-9_]+", e)}
    missing = sorted(used - names)
    assert not missing, f"queries name series the main does not export: {missing}"
    # everything that matters to an operator has a panel
    for name in (
        "letsinfer_model_ready_groups",
        "letsinfer_group_tokens_total",
        "letsinfer_node_facts_age_seconds",
        "letsinfer_node_certificate_expiry_seconds",
        "letsinfer_gpu_temperature_celsius",
        "letsinfer_key_requests_total",
    ):
        assert any(name in e for e in exprs), name


def test_requests_booked_together_count_as_each_would_alone() -> None:
    routing = RoutingTable()
    admission = Admission(routing, RoutingPolicy(), AdmissionLimits())
    together, alone = GatewayMetrics(routing, admission), GatewayMetrics(routing, admission)
    finished = [
        ("chat", 200, 0.5, 0.1, "team-a", "pg-1", 7, 9),
        ("chat", 200, 0.02, None, "team-a", "pg-1", 3, None),
        ("chat", 429, 0.0, None, "team-b", "-", None, None),
        ("code", 200, 1.5, 0.2, "team-b", "pg-2", 0, 4),
        # on a bucket's bound, and past the last one: where observe() puts them
        ("chat", 200, 0.005, 0.005, "team-a", "pg-1", 1, 1),
        ("chat", 500, 200.0, 0.001, "team-a", "pg-1", None, None),
    ]
    together.requests(finished)
    for model, status, total, ttft, key, pg, prompt, completion in finished:
        alone.request(
            model, status, total, ttft, key=key, pg=pg, prompt_tokens=prompt,
            completion_tokens=completion,
        )  # fmt: skip

    def samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        scrape = generate_latest(metrics.registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(scrape)
            for s in f.samples
            if not s.name.endswith("_created")  # when each series began
        }

    values = samples(together)
    assert values == samples(alone)
    assert values[("letsinfer_gateway_requests_total", (("model", "chat"), ("status", "200")))] == 3
    assert values[("letsinfer_key_tokens_total", (("key", "team-a"), ("kind", "prompt")))] == 11
    assert ("letsinfer_key_tokens_total", (("key", "team-b"), ("kind", "prompt"))) not in values


def node(name: str, role: str = "child", *gpus: str, state: str = "active") -> NodeSample:
    listed = tuple({"uuid": f"GPU-{name}-{i}", "name": g} for i, g in enumerate(gpus))
    return NodeSample(f"id-{name}", name, role, state, False, None, None, None, None, listed)


def ask(app: ASGIApp, *requests: tuple[str, str]) -> list[httpx.Response]:
    """``requests`` (method, path) to ``app`` as if it listened on [::1]:9400."""

    async def send_all() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://[::1]:9400") as client:
            return [await client.request(method, path) for method, path in requests]

    return asyncio.run(send_all())


def test_service_discovery_lists_each_active_node_as_a_target_of_the_listener() -> None:
    """Children have no metrics listener (the main exports their series), so
    every node's target is the listener the request reached, told apart by
    ?node=NAME (__param_node) and named by instance; only GET reads the
    list."""
    nodes = (
        node("n1", "child", "NVIDIA H200", "NVIDIA H200"),
        node("main", "main"),
        node("gone", state="removed"),
    )
    app = with_discovery(
        make_asgi_app(registry=CollectorRegistry()), CollectorRegistry(), lambda: nodes
    )
    sd, posted, scrape = ask(app, ("GET", "/sd"), ("POST", "/sd"), ("GET", "/metrics"))
    assert sd.status_code == 200 and sd.headers["content-type"] == "application/json"

    def group(name: str, role: str, gpus: str, names: str) -> dict[str, object]:
        labels = {
            "__meta_letsinfer_node": name,
            "__meta_letsinfer_role": role,
            "__meta_letsinfer_gpus": gpus,
            "__meta_letsinfer_gpu_names": names,
            "__param_node": name,
            "instance": name,
        }
        return {"targets": ["[::1]:9400"], "labels": labels}

    assert sd.json() == [
        group("main", "main", "0", ""),
        group("n1", "child", "2", ",NVIDIA H200,NVIDIA H200,"),
    ]
    assert posted.status_code == 405 and posted.headers["allow"] == "GET"
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")


Samples = Counter[tuple[str, tuple[tuple[str, str], ...], float]]


def samples_of(text: str) -> Samples:
    return Counter(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    )


def test_each_node_target_serves_its_own_samples_and_all_targets_every_sample_once() -> None:
    registry, view = main_registry(clock=lambda: 1_000_000.0)
    view.nodes = (*view.nodes, node("main", "main", "H200"), node("n2", "child", "H100"))
    view.groups = (
        *view.groups,
        GroupSample("pg-3", "chat", "main", "running", "ready", 0, None),
        # still recorded on a node removed since: no target of its own
        GroupSample("pg-4", "chat", "n9", "stopped", "stopped", 0, None),
    )
    app = with_discovery(make_asgi_app(registry=registry), registry, lambda: view.nodes)
    names = [g["labels"]["__meta_letsinfer_node"] for g in ask(app, ("GET", "/sd"))[0].json()]
    assert names == ["main", "n1", "n2"]
    plain, *targets = ask(app, ("GET", "/metrics"), *(("GET", f"/metrics?node={n}") for n in names))
    assert plain.text == generate_latest(registry).decode()  # plain /metrics as before
    assert all(t.status_code == 200 for t in targets)
    main, n1, n2 = (samples_of(t.text) for t in targets)

    def nodes_in(got: Samples) -> set[str | None]:
        return {dict(labels).get("node") for _, labels, _ in got}

    assert nodes_in(main) == {None, "main", "n9"}
    assert nodes_in(n1) == {"n1"} and nodes_in(n2) == {"n2"}
    assert ("letsinfer_gateway_requests_total", (("model", "chat"), ("status", "200")), 1.0) in main
    assert ("letsinfer_node_info", (("node", "n1"), ("role", "child")), 1.0) in n1
    assert any(name == "letsinfer_gpu_memory_total_bytes" for name, _, _ in n1)
    assert any(name == "letsinfer_node_info" for name, _, _ in n2)
    assert main + n1 + n2 == samples_of(plain.text)


def test_a_node_target_of_no_active_node_is_not_found() -> None:
    registry, view = main_registry()
    view.nodes = (*view.nodes, node("main", "main"), node("gone", state="removed"))
    app = with_discovery(make_asgi_app(registry=registry), registry, lambda: view.nodes)
    for path, name in [
        ("/metrics?node=n7", "n7"),
        ("/metrics?node=gone", "gone"),
        ("/metrics?node=", ""),
    ]:
        [answer] = ask(app, ("GET", path))
        assert answer.status_code == 404, path
        assert answer.text == f"no active node named {name!r}\n"
