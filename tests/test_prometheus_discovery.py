"""Prometheus HTTP service discovery from the main's metrics listener, with a
real Prometheus (Debian package ``prometheus``) in a network-namespace
cluster: it finds every active node through ``http_sd_configs`` as a target
of its own (the main's listener with ``?node=NAME``: children have no metrics
listener; the main makes their series from their signed facts), scrapes each,
gets every series once, and a removed node's target leaves it. A lab host
outside the allowed networks gets nothing from the discovery endpoint
either."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster import Cluster
from tests.netlab import NetLab

PY = sys.executable
NODE_INFO = "letsinfer_node_info"
GPUS = [
    {"uuid": "GPU-main-a", "name": "Fake H100", "memory_total": 80 << 30},
    {"uuid": "GPU-main-b", "name": "Fake H100", "memory_total": 80 << 30},
]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="prometheus (Debian package prometheus) not installed",
    ),
]

# One GET from inside a lab host: status, content type and body, or the error.
_GET = """
import json, sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        print(json.dumps({"status": r.status, "type": r.headers["content-type"],
                          "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "type": e.headers["content-type"],
                      "body": e.read().decode()}))
except OSError as e:
    print(json.dumps({"error": repr(e)}))
"""


def get(c: Cluster, host: str, url: str) -> dict[str, Any]:
    done = c.lab.run(host, PY, "-c", _GET, url, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("prometheus-sd")
    # x: a host on the LAN in no letsinfer group, outside metrics_allow.
    lab = NetLab(["main", "n1", "x"]).up()
    c = Cluster(lab, root)
    main = lab.hosts["main"]
    (root / "gpus.json").write_text(json.dumps(GPUS))
    c.extra_env = {
        "main": {
            "LETSINFER_HARDWARE__FAKE_GPUS": str(root / "gpus.json"),
            # Exposed on the lab address, to the main's own address only (where
            # its Prometheus runs).
            "LETSINFER_GATEWAY__METRICS_HOST": main,
            "LETSINFER_GATEWAY__METRICS_ALLOW": f"{main}/32",
        }
    }
    try:
        c.main_with_children(("n1",))
        yield c
    finally:
        c.stop()
        lab.down()


@pytest.fixture
def prometheus(cluster: Cluster, tmp_path: Path) -> Iterator[str]:
    """A Prometheus in the main's namespace on its loopback, discovering its
    targets from the main with no relabelling; yields its API's base URL."""
    c = cluster
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "letsinfer",
                "http_sd_configs": [
                    {"url": f"http://{c.lab.hosts['main']}:9400/sd", "refresh_interval": "1s"}
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # YAML is a superset
    log = (tmp_path / "prometheus.log").open("w")
    proc = c.lab.popen(
        "main",
        "prometheus",
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        "--web.listen-address=127.0.0.1:9090",
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    base = "http://127.0.0.1:9090"
    try:
        c.wait(
            lambda: proc.poll() is None and get(c, "main", f"{base}/-/ready").get("status") == 200,
            f"prometheus ready ({(tmp_path / 'prometheus.log').read_text()[-2000:]})",
        )
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def api(c: Cluster, base: str, path: str) -> Any:
    answer = get(c, "main", f"{base}/api/v1/{path}")
    assert answer.get("status") == 200, answer
    return json.loads(answer["body"])["data"]


def targets(c: Cluster, base: str) -> list[tuple[str, str, str]]:
    """Prometheus's active targets: instance, health, scrape URL."""
    active = api(c, base, "targets?state=active")["activeTargets"]
    return sorted((t["labels"]["instance"], t["health"], t["scrapeUrl"]) for t in active)


def stored_series(c: Cluster, base: str) -> list[dict[str, str]]:
    """The label sets of every letsinfer series Prometheus holds now (not
    its own per-target up and scrape_* series)."""
    result = api(c, base, "query?query=" + quote('{job="letsinfer",__name__=~"letsinfer_.*"}'))
    result = result["result"]
    return [r["metric"] for r in result]


def plain_node_info(c: Cluster) -> dict[str, float]:
    """letsinfer_node_info by node, from the main's plain /metrics."""
    answer = get(c, "main", f"http://{c.lab.hosts['main']}:9400/metrics")
    assert answer.get("status") == 200, answer
    [family] = [f for f in text_string_to_metric_families(answer["body"]) if f.name == NODE_INFO]
    return {s.labels["node"]: s.value for s in family.samples}


def group(name: str, role: str, gpus: list[str], address: str) -> dict[str, Any]:
    return {
        "targets": [address],
        "labels": {
            "__meta_letsinfer_node": name,
            "__meta_letsinfer_role": role,
            "__meta_letsinfer_gpus": str(len(gpus)),
            "__meta_letsinfer_gpu_names": f",{','.join(gpus)}," if gpus else "",
            "__param_node": name,
            "instance": name,
        },
    }


def test_prometheus_scrapes_each_node_as_its_own_target_and_a_removed_node_leaves(
    cluster: Cluster, prometheus: str
) -> None:
    c = cluster
    main = c.lab.hosts["main"]
    listener = f"{main}:9400"
    sd_url = f"http://{listener}/sd"
    main_group = group("main", "main", ["Fake H100", "Fake H100"], listener)
    sd = get(c, "main", sd_url)
    assert sd.get("status") == 200 and sd["type"] == "application/json", sd
    assert json.loads(sd["body"]) == [main_group, group("n1", "child", [], listener)]

    # A LAN host outside metrics_allow is closed on, as for /metrics.
    assert "error" in get(c, "x", sd_url)

    scrape = f"http://{listener}/metrics"
    c.wait(
        lambda: (
            targets(c, prometheus)
            == [("main", "up", f"{scrape}?node=main"), ("n1", "up", f"{scrape}?node=n1")]
        ),
        "prometheus scraping each node's discovered target",
    )

    def each_series_once() -> bool:
        series = stored_series(c, prometheus)
        info = {(s["node"], s["instance"]) for s in series if s["__name__"] == NODE_INFO}
        # The same series from two targets would differ only by instance.
        without_instance = Counter(
            frozenset((k, v) for k, v in s.items() if k != "instance") for s in series
        )
        return info == {("main", "main"), ("n1", "n1")} and max(without_instance.values()) == 1

    c.wait(each_series_once, "every node's series, each from one target")
    for s in stored_series(c, prometheus):
        # A node's series come from its own target; the rest from the main's.
        assert s["instance"] == s.get("node", "main"), s
    n1_info = api(c, prometheus, "query?query=" + quote(f'{NODE_INFO}{{node="n1"}}'))["result"]
    assert [(r["metric"]["instance"], float(r["value"][1])) for r in n1_info] == [
        ("n1", plain_node_info(c)["n1"])
    ]

    c.ok("main", "node", "remove", "n1")
    c.wait(
        lambda: json.loads(get(c, "main", sd_url)["body"]) == [main_group],
        "n1 gone from the discovered targets",
    )
    gone = get(c, "main", f"{scrape}?node=n1")
    assert (gone["status"], gone["body"]) == (404, "no active node named 'n1'\n")
    c.wait(
        lambda: targets(c, prometheus) == [("main", "up", f"{scrape}?node=main")],
        "n1's target gone from prometheus",
    )
    c.wait(
        lambda: (
            {s["node"] for s in stored_series(c, prometheus) if s["__name__"] == NODE_INFO}
            == {"main"}
        ),
        "n1's series gone from prometheus",
    )
    assert "n1" not in plain_node_info(c)
