"""What ships for Prometheus and Grafana (monitoring/): the alert rules pass
promtool's checks and unit tests, and every dashboard query names series the
main's metrics endpoint really exports. A real cluster's scrape, and a
stopped model firing the no-ready-group rule, are in test_cluster_serving.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from letsinfer.gateway.admission import Admission, AdmissionLimits
from letsinfer.gateway.metrics import GatewayMetrics
from letsinfer.gateway.policy import RoutingPolicy
from letsinfer.gateway.routing import Replica, RoutingTable
from letsinfer.telemetry.collector import ClusterCollector
from letsinfer.telemetry.view import ClusterView, GroupSample, NodeSample

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "monitoring"
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)


def scrape_text() -> str:
    """The main's registry as node.py wires it, with one node, GPU, group and
    request, scraped through prometheus_client's own exposition."""
    routing = RoutingTable()
    admission = Admission(routing, RoutingPolicy(), AdmissionLimits())
    metrics = GatewayMetrics(routing, admission)
    view = ClusterView(store=None)  # type: ignore[arg-type]  # filled by hand below
    now = time.time()
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
    metrics.registry.register(ClusterCollector(view, routing))
    metrics.request(
        "chat", 200, 0.5, 0.1, key="team-a", pg="pg-1", prompt_tokens=7, completion_tokens=9
    )
    metrics.error("queue_full")
    return generate_latest(metrics.registry).decode()


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
