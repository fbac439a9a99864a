"""``letsinfer top``: the main's metrics, scraped over loopback and shown as
tables; rates (requests and tokens per second) from two scrapes."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group
from rich.table import Table

from letsinfer.config import GatewaySettings

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Scrape:
    at: float  # time.monotonic()
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def series(self, name: str) -> list[tuple[dict[str, str], float]]:
        return self.samples.get(name, [])

    def sum_by(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for labels, value in self.series(name):
            out[labels.get(label, "")] += value
        return out


def parse(text: str, at: float) -> Scrape:
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append((dict(s.labels), float(s.value)))
    return Scrape(at, dict(samples))


class MetricsUnread(Exception):
    """Why there are no metrics to show, as `top` on the main says it."""


def metrics_url(gw: GatewaySettings) -> str:
    """The main's metrics endpoint, over this host's own address."""
    if gw.metrics_port == 0:
        raise MetricsUnread(
            "metrics are off ([gateway] metrics_port = 0); top reads them: set a port"
        )
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
        gw.metrics_host, gw.metrics_host
    )
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{gw.metrics_port}/metrics"


def read_metrics(url: str, timeout_s: float = 5.0) -> str:
    resp = httpx.get(url, timeout=timeout_s)
    resp.raise_for_status()
    return resp.text


def metrics_text(gw: GatewaySettings) -> str:
    """The main's metrics as Prometheus scrapes them: for `top` on the main,
    and for a controller's (the admin API's GET /v1/ops/metrics)."""
    url = metrics_url(gw)
    try:
        return read_metrics(url)
    except httpx.HTTPError as exc:
        raise MetricsUnread(
            f"cannot read the metrics at {url}: {exc} (is the main node running here?)"
        ) from exc


def scrape(text: str) -> Scrape:
    """A sample of the metrics, timed now."""
    return parse(text, time.monotonic())


def _rate(prev: Scrape | None, cur: Scrape, name: str, label: str) -> dict[str, float | None]:
    now = cur.sum_by(name, label)
    if prev is None or cur.at <= prev.at:
        return dict.fromkeys(now)
    before = prev.sum_by(name, label)
    dt = cur.at - prev.at
    return {k: max(0.0, v - before.get(k, 0.0)) / dt for k, v in now.items()}


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _one(scrape: Scrape, name: str) -> dict[Labels, float]:
    return {tuple(sorted(labels.items())): v for labels, v in scrape.series(name)}


def render(prev: Scrape | None, cur: Scrape) -> Group:
    models = Table(title="models", title_justify="left")
    for col in ("model", "state", "ready groups", "groups", "queue", "req/s", "tokens/s"):
        models.add_column(col, justify="left" if col in ("model", "state") else "right")
    ready = cur.sum_by("letsinfer_model_ready_groups", "model")
    # loaded, loading, unloaded or scaling for a model with a scaling policy
    states = {labels["model"]: labels["state"] for labels, _ in cur.series("letsinfer_model_state")}
    meant = cur.sum_by("letsinfer_model_groups", "model")
    queue = cur.sum_by("letsinfer_gateway_queue_depth", "model")
    rps = _rate(prev, cur, "letsinfer_gateway_requests_total", "model")
    tps = _rate(prev, cur, "letsinfer_group_tokens_total", "model")
    for model in sorted(ready):
        style = "red" if ready[model] == 0 else ""
        models.add_row(
            f"[{style}]{model}[/{style}]" if style else model,
            states.get(model, "loaded" if ready[model] else "not ready"),
            _num(ready[model], "{:.0f}"),
            _num(meant.get(model), "{:.0f}"),
            _num(queue.get(model, 0.0), "{:.0f}"),
            _num(rps.get(model)),
            _num(tps.get(model)),
        )

    groups = Table(title="placement groups", title_justify="left")
    for col in ("model", "group", "node", "state", "routed", "free slots", "restarts"):
        groups.add_column(col)
    free = {labels["pg"]: v for labels, v in cur.series("letsinfer_group_free_slots")}
    routed = {labels["pg"]: v for labels, v in cur.series("letsinfer_group_ready")}
    restarts = {labels["pg"]: v for labels, v in cur.series("letsinfer_group_restarts_total")}
    for labels, _ in sorted(
        cur.series("letsinfer_group_state"), key=lambda s: (s[0]["model"], s[0]["pg"])
    ):
        pg = labels["pg"]
        state = labels["state"]
        if labels["desired"] != "running":
            state += f" (desired {labels['desired']})"
        groups.add_row(
            labels["model"],
            pg,
            labels["node"],
            state,
            "yes" if routed.get(pg) else "no",
            _num(free.get(pg), "{:.0f}"),
            _num(restarts.get(pg), "{:.0f}"),
        )

    nodes = Table(title="nodes", title_justify="left")
    for col in ("node", "role", "facts age", "certificate", "firewall", "paused"):
        nodes.add_column(col)
    age = cur.sum_by("letsinfer_node_facts_age_seconds", "node")
    cert = cur.sum_by("letsinfer_node_certificate_expiry_seconds", "node")
    fw = cur.sum_by("letsinfer_node_firewall_loaded", "node")
    paused = cur.sum_by("letsinfer_node_paused", "node")
    for labels, _ in sorted(cur.series("letsinfer_node_info"), key=lambda s: s[0]["node"]):
        n = labels["node"]
        nodes.add_row(
            n,
            labels["role"],
            _num(age.get(n), "{:.0f}s"),
            _num(cert[n] / 86400 if n in cert else None, "{:.0f} days"),
            "-" if n not in fw else ("loaded" if fw[n] else "[red]absent[/red]"),
            "yes" if paused.get(n) else "no",
        )

    gpus = Table(title="GPUs", title_justify="left")
    for col in ("node", "gpu", "temp °C", "util", "memory used", "power W"):
        gpus.add_column(col)
    temp = _one(cur, "letsinfer_gpu_temperature_celsius")
    util = _one(cur, "letsinfer_gpu_utilization_ratio")
    total = _one(cur, "letsinfer_gpu_memory_total_bytes")
    free_mem = _one(cur, "letsinfer_gpu_memory_free_bytes")
    power = _one(cur, "letsinfer_gpu_power_watts")
    for key in sorted(total):
        d = dict(key)
        used = total[key] - free_mem.get(key, total[key])
        gpus.add_row(
            d["node"],
            d["gpu"],
            _num(temp.get(key), "{:.0f}"),
            _num(util[key] * 100 if key in util else None, "{:.0f}%"),
            f"{used / 2**30:.1f} / {total[key] / 2**30:.1f} GiB",
            _num(power.get(key), "{:.0f}"),
        )
    parts = [models, groups, nodes]
    if total:
        parts.append(gpus)
    return Group(*parts)
