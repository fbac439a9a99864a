"""Cluster serving: a main and two children in namespaces, models placed on the
children, served through the main's gateway, surviving what operators see."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from letsinfer.engines.releases import xllamacpp_cpu
from letsinfer.engines.tinymodel import LORA_SENTENCE, SENTENCE, write_tiny_lora
from tests.cluster import PY, Cluster, as_node, broken, served_by, streaming
from tests.db_writer import cut_audit, put_back, rewrite_audit_from
from tests.firewall import render
from tests.netlab import NetLab, can_make_namespaces
from tests.nodes import processes_using

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")

ROOT = Path(__file__).resolve().parent.parent
GPUS = [
    {"uuid": "GPU-n1-a", "name": "Fake H100", "memory_total": 80 << 30, "temperature_c": 47},
    {"uuid": "GPU-n1-b", "name": "Fake H100", "memory_total": 80 << 30, "power_w": 310.5},
    {"uuid": "GPU-n1-c", "name": "Fake H100", "memory_total": 80 << 30},
]
N2_GPUS = [{"uuid": "GPU-n2-a", "name": "Fake H100", "memory_total": 80 << 30}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("serving")
    lab = NetLab(["main", "n1", "n2"]).up()
    c = Cluster(lab, root)
    shim = root / "llama-server"
    shim.write_text(f'#!/bin/sh\nexec {PY} {ROOT / "tests/llama_server_shim.py"} "$@"\n')
    shim.chmod(0o755)
    broken = root / "llama-server-broken"  # a build that never starts (it answers --version)
    broken.write_text(
        f'#!/bin/sh\nLLAMA_SHIM_FAIL=1 exec {PY} {ROOT / "tests/llama_server_shim.py"} "$@"\n'
    )
    broken.chmod(0o755)
    parking = {
        "LETSINFER_AGENT__PARK_AFTER_FAILED_STARTS": "2",
        "LETSINFER_AGENT__RESTART_BACKOFF_INITIAL_S": "0.2",
    }
    (root / "gpus.json").write_text(json.dumps(GPUS))
    (root / "gpus-n2.json").write_text(json.dumps(N2_GPUS))
    c.extra_env = {
        "main": {
            "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(shim),
            "LETSINFER_CONTROL__NODE_STALE_AFTER_S": "3",
            "LETSINFER_ENGINE__THREADS": "1",
            # the webhook of given_webhook: an address of the lab's (private)
            "LETSINFER_FETCH__ALLOW_NETWORKS": f"{lab.hosts['n2']}/32",
        },
        "n1": {
            "LETSINFER_HARDWARE__FAKE_GPUS": str(root / "gpus.json"),
            "LLAMA_SHIM_RECORD": str(root / "shim-env.json"),
            "LETSINFER_ENGINE__THREADS": "1",
            "LETSINFER_ENGINE__PARALLEL": "2",
            **parking,
        },
        "n2": {
            "LETSINFER_HARDWARE__FAKE_GPUS": str(root / "gpus-n2.json"),
            "LETSINFER_ENGINE__THREADS": "1",
            "LETSINFER_ENGINE__PARALLEL": "2",
            **parking,
        },
    }
    try:
        c.main_with_children()
        from letsinfer.engines.tinymodel import write_tiny_model

        write_tiny_model(root / "shared.gguf")
        c.ok("main", "model", "add", "shared", "--gguf", str(root / "shared.gguf"), "--no-serve")
        yield c
    finally:
        c.stop()
        lab.down()


def pgs(c: Cluster, model: str) -> dict[str, dict[str, object]]:
    info = json.loads(c.ok("main", "model", "show", model, "--json"))
    return {str(pg["node"]): pg for pg in info["placement_groups"]}


def wait_ready(c: Cluster, model: str, nodes: set[str], timeout: float = 90) -> None:
    c.wait(
        lambda: {n for n, pg in pgs(c, model).items() if pg["state"] == "ready"} >= nodes,
        f"{model} ready on {nodes}",
        timeout=timeout,
    )


def load(c: Cluster, model: str, n: int = 24, threads: int = 4, prompt: str = "hi") -> list[int]:
    url = f"http://{c.lab.hosts['main']}:8000"
    result = c.lab.run(
        "main",
        PY,
        str(ROOT / "tests/load_client.py"),
        url,
        c.key,
        model,
        str(n),
        str(threads),
        prompt,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def served_since(c: Cluster, model: str, before: dict[str, int], n: int) -> dict[str, int]:
    """Requests for ``model`` served per group since ``before``, once all ``n``
    are in the access log (a line is written just after its answer leaves)."""

    def since() -> dict[str, int]:
        after = served_by(c, model)
        return {pg: k - before.get(pg, 0) for pg, k in after.items() if k > before.get(pg, 0)}

    c.wait(lambda: sum(since().values()) >= n, f"{n} lines for {model} in the access log")
    return since()


def load_error(c: Cluster, model: str) -> dict[str, Any]:
    """One chat request through the main's gateway, and /health, as a client sees them."""
    main = c.lab.hosts["main"]
    return json.loads(  # type: ignore[no-any-return]
        c.py(
            "main",
            f"""
import httpx, json
r = httpx.post("http://{main}:8000/v1/chat/completions", timeout=30,
               headers={{"authorization": "Bearer {c.key}"}},
               json={{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}})
h = httpx.get("http://{main}:8000/health")
error = r.json().get("error") or {{}}
print(json.dumps({{"status": r.status_code, "code": error.get("code"),
                  "retry_after": r.headers.get("retry-after"),
                  "health": [h.status_code, h.json()]}}))
""",
        )
    )


def release_add(c: Cluster, binary: Path, target: str = "cpu") -> str:
    out = c.ok("main", "release", "add", "--llama-server", str(binary), "--target", target)
    return out.split(": ", 1)[1].split()[0]


def free_gpu(c: Cluster, node: str) -> str:
    """A GPU of ``node`` that no group holds (a restart may move a group to another)."""
    [n] = [n for n in json.loads(c.ok("main", "topology", "--json")) if n["name"] == node]
    return next(str(g["uuid"]) for g in n["gpus"] if g["placement_group"] is None)


def rollout(c: Cluster, *args: str) -> tuple[int, dict[str, Any]]:
    done = c.cli("main", "model", *args, "--json", timeout=300)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def routed(c: Cluster) -> dict[str, int]:
    """Per model, the groups the main's gateway routes to now (its /health)."""
    health = c.py(
        "main",
        f"""
import httpx
print(httpx.get("http://{c.lab.hosts["main"]}:8000/health",
                headers={{"authorization": "Bearer {c.key}"}}).text)""",
    )
    return json.loads(health)["models"]  # type: ignore[no-any-return]


# Every test stands alone: it starts by calling the givens it needs, each of
# which makes its state true only where it is not (a test before it, in any
# order, may have made it already, or changed it).

SHARED = {"n1": ["--target", "cpu"], "n2": ["--target", "cpu"]}  # the replicated model
BIG = {"n1": ["--gpu", "GPU-n1-a"]}  # the model on one exact GPU of n1
WARM = {"n1": ["--gpu", "GPU-n1-c"], "n2": ["--gpu", "GPU-n2-a"]}  # one GPU on each child

InstallArgs = list[str] | Callable[[], list[str]]


def given_up(c: Cluster, name: str) -> None:
    """Node ``name`` runs and reports (a test before may have stopped it)."""
    proc = c.procs.get(name)
    if proc is not None and proc.poll() is None:
        return
    c.up(name)
    c.wait(lambda: node_state(c, name) == "active", f"{name} reporting again")


def given_model(c: Cluster, name: str, on: dict[str, InstallArgs], running: bool = True) -> None:
    """Model ``name`` (the tiny model's bytes) with a group on each node of ``on``,
    installed with its arguments (a callable: worked out only then) where it has
    none; started if stopped and ready, or with ``running`` False stopped (its
    groups hold their GPUs, no engine runs)."""
    shown = c.cli("main", "model", "show", name, "--json")
    placed: dict[str, dict[str, Any]] = {}
    if shown.returncode != 0:
        c.ok("main", "model", "add", name, "--gguf", str(c.root / "shared.gguf"), "--no-serve")
    else:
        placed = {str(pg["node"]): pg for pg in json.loads(shown.stdout)["placement_groups"]}
    installed = False
    for node, args in on.items():
        given_up(c, node)
        if node not in placed:
            wanted = args() if callable(args) else args
            c.ok("main", "model", "install", name, "--node", node, *wanted, "--yes")
            installed = True
    if running:
        if any(pg["desired"] != "running" for pg in placed.values()):
            c.ok("main", "model", "start", name)
        wait_ready(c, name, set(on))
    elif installed or any(pg["desired"] == "running" for pg in placed.values()):
        c.ok("main", "model", "stop", name, timeout=120)


def given_no_model(c: Cluster, name: str) -> None:
    """No model ``name`` (its groups stopped and gone, their GPUs free)."""
    if c.cli("main", "model", "show", name, "--json").returncode == 0:
        c.ok("main", "model", "remove", name, "--stop", timeout=120)


def given_gpu_free(c: Cluster, node: str, gpu: str) -> None:
    """No group holds ``gpu`` of ``node``: a restart may have moved one of any
    model onto it; that model goes (the givens of the tests that need it place
    it again)."""
    [n] = [n for n in json.loads(c.ok("main", "topology", "--json")) if n["name"] == node]
    [holder] = [g["placement_group"] for g in n["gpus"] if g["uuid"] == gpu]
    if holder is None:
        return
    for m in json.loads(c.ok("main", "model", "list", "--json")):
        if holder in {pg["id"] for pg in m["placement_groups"]}:
            given_no_model(c, m["name"])


# Events for a webhook the main can never reach (a closed port of n2's): each
# stays queued, retried, and `webhook deliveries` lists it by its event.
HOOK_EVENTS = "upgrade.finished,upgrade.failed,rollback.finished,rollback.failed,audit.tampering"


def given_webhook(c: Cluster) -> str:
    """The main has a webhook for upgrades, rollbacks and tampering; its URL."""
    url = f"http://{c.lab.hosts['n2']}:9/letsinfer-hooks"
    if url not in {w["url"] for w in json.loads(c.ok("main", "webhook", "list", "--json"))}:
        secret = c.root / "hook.secret"
        secret.touch(mode=0o600)
        secret.write_text("whsec_" + "A" * 32)
        c.ok("main", "webhook", "add", url, "--events", HOOK_EVENTS, "--secret-file", str(secret))
    return url


def announced(c: Cluster, url: str, event: str) -> set[int]:
    """The audit records (their seq) the main has queued ``event`` for, to ``url``:
    from the deliveries' own bodies, as an endpoint would get them."""
    rows = json.loads(c.ok("main", "webhook", "deliveries", url, "--limit", "1000", "--json"))
    ids = [row["id"] for row in rows if row["event"] == event]
    db = f"file:{c.home('main') / 'var/authority.db'}?mode=ro"
    with sqlite3.connect(db, uri=True) as conn:
        bodies = [
            conn.execute("SELECT body FROM webhook_deliveries WHERE id = ?", (i,)).fetchone()[0]
            for i in ids
        ]
    return {int(json.loads(body)["data"]["audit_seq"]) for body in bodies}


def last_audit_seq(c: Cluster, action: str, outcome: str) -> int:
    wanted = (action, outcome)
    return max(int(str(r["seq"])) for r in c.audit("main") if (r["action"], r["outcome"]) == wanted)


def given_release(c: Cluster, name: str, release: str) -> None:
    """Every group of ``name`` runs ``release`` (upgraded to it where not)."""
    if {str(pg["release"]) for pg in pgs(c, name).values()} != {release}:
        code, result = rollout(c, "upgrade", name, "--release", release)
        assert code == 0, result


def given_only_running_on(c: Cluster, node: str, names: set[str]) -> None:
    """Of the models with a group on ``node``, only ``names`` run: others stop."""
    for m in json.loads(c.ok("main", "model", "list", "--json")):
        on_node = [pg for pg in m["placement_groups"] if pg["node"] == node]
        if m["name"] not in names and any(pg["desired"] == "running" for pg in on_node):
            c.ok("main", "model", "stop", m["name"], timeout=120)


def test_install_on_two_children_serves_through_both(cluster: Cluster) -> None:
    c = cluster
    # Its subject is the groups' creation: shared starts with none (a test
    # before may have placed some; the givens of the tests after place them again).
    if pgs(c, "shared"):
        c.ok("main", "model", "remove", "shared", "--stop", timeout=120)
        c.ok("main", "model", "add", "shared", "--gguf", str(c.root / "shared.gguf"), "--no-serve")
    given_up(c, "n1")
    given_up(c, "n2")
    before = served_by(c, "shared")  # (requests earlier groups served, if any)
    out = c.ok(
        "main",
        "model",
        "install",
        "shared",
        "--node",
        "n1",
        "--node",
        "n2",
        "--target",
        "cpu",
        "--yes",
    )
    assert "install n1" in out.replace("  ", " ") and "2 placement group(s) created" in out
    wait_ready(c, "shared", {"n1", "n2"})
    assert load(c, "shared") == [200] * 24
    by_pg = served_since(c, "shared", before, 24)
    placed = {str(pg["id"]) for pg in pgs(c, "shared").values()}
    assert set(by_pg) == placed, (by_pg, placed)
    # Children's engines listen inside [engine] port_first..port_last (the range
    # the firewall keeps to the main), on their data address.
    for node, pg in pgs(c, "shared").items():
        url = httpx.URL(str(pg["endpoint"]))
        assert url.host == c.lab.hosts[node] and 21000 <= (url.port or 0) <= 29999, pg

    topo = json.loads(c.ok("main", "topology", "--json"))
    n1 = next(n for n in topo if n["name"] == "n1")
    assert n1["targets"] == ["cpu", "cuda"] and {g["uuid"] for g in n1["gpus"]} == {
        "GPU-n1-a",
        "GPU-n1-b",
        "GPU-n1-c",
    }


def answer(c: Cluster, model: str) -> str:
    """One chat answer through the main's gateway, from inside the main's namespace."""
    main = c.lab.hosts["main"]
    return c.py(
        "main",
        f"""
import httpx
r = httpx.post("http://{main}:8000/v1/chat/completions", timeout=60,
               headers={{"authorization": "Bearer {c.key}"}},
               json={{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}})
assert r.status_code == 200, r.text
print(r.json()["choices"][0]["message"]["content"], end="")
""",
    )


def test_a_lora_adapter_travels_to_a_child_with_its_model(cluster: Cluster) -> None:
    """The child fetches the adapter from the main beside the weights, its engine
    loads it unapplied, and its facts say so: only then does the gateway route
    the adapter's requests there, with the adapter's id."""
    c = cluster
    c.ok("main", "model", "add", "based", "--gguf", str(c.root / "shared.gguf"), "--no-serve")
    c.ok("main", "model", "install", "based", "--node", "n1", "--target", "cpu", "--yes")
    wait_ready(c, "based", {"n1"})
    lora = write_tiny_lora(c.root / "tuned.gguf")
    out = c.ok(
        "main", "model", "adapter", "add", "based", "based-tuned", "--gguf", str(lora), timeout=300
    )
    assert "on n1: ready" in " ".join(out.split()), out
    digest = hashlib.sha256(lora.read_bytes()).hexdigest()
    assert (c.home("n1") / "var/models/sha256" / f"{digest}.gguf").is_file()
    assert [answer(c, "based-tuned"), answer(c, "based")] == [LORA_SENTENCE, SENTENCE]
    [pg] = [str(g["id"]) for g in pgs(c, "based").values()]
    assert served_since(c, "based-tuned", {}, 1) == {pg: 1}
    c.ok("main", "model", "stop", "based")
    c.ok("main", "model", "remove", "based")


def test_a_group_on_a_hot_gpu_gets_fewer_requests(cluster: Cluster) -> None:
    """The nodes' signed facts reach the gateway's replica choice: of two
    groups of one model, the one whose GPU runs hot is passed over."""
    c = cluster
    given_model(c, "warm", WARM)
    on = {node: str(pg["id"]) for node, pg in pgs(c, "warm").items()}
    files = {"n1": (c.root / "gpus.json", GPUS), "n2": (c.root / "gpus-n2.json", N2_GPUS)}

    def heat(hot: str) -> None:
        for node, (path, gpus) in files.items():
            temperature = 95 if node == hot else 45
            path.write_text(json.dumps([{**g, "temperature_c": temperature} for g in gpus]))

        def reported() -> bool:
            topology = {n["name"]: n for n in json.loads(c.ok("main", "topology", "--json"))}
            return all(
                {g["temperature_c"] for g in topology[node]["gpus"]} == {95 if node == hot else 45}
                for node in files
            )

        c.wait(reported, f"facts saying {hot}'s GPU is hot")

    # "hi" carries no affinity hint; a chat with a long enough start does (one
    # prefix for all: affinity alone would send every one to one group).
    hinted = "You are a helpful assistant: answer in one short sentence, please."
    try:
        # Both ways round: a choice blind to the facts favours the same group twice.
        for hot, cool in (("n1", "n2"), ("n2", "n1")):
            heat(hot)
            for prompt in ("hi", hinted):
                before = served_by(c, "warm")
                assert load(c, "warm", n=10, threads=1, prompt=prompt) == [200] * 10
                served = served_since(c, "warm", before, 10)
                got = {n: served.get(on[n], 0) for n in (hot, cool)}
                assert got[hot] < got[cool], (hot, prompt, got)
    finally:
        for path, gpus in files.values():
            path.write_text(json.dumps(gpus))
        c.ok("main", "model", "stop", "warm")


def metrics(c: Cluster) -> str:
    """The main's metrics endpoint, from its own host (it listens on loopback)."""
    return c.py("main", "import httpx; print(httpx.get('http://127.0.0.1:9400/metrics').text)")


def doctor_cluster(c: Cluster) -> tuple[int, dict[str, str]]:
    """`doctor --cluster` on the main: exit code, failing check -> message."""
    done = c.cli("main", "doctor", "--cluster", "--json")
    report = json.loads(done.stdout)
    return done.returncode, {
        f["check"]: f["message"] for f in report["findings"] if f["level"] == "fail"
    }


def expired_copy(cert_pem: bytes, ca_dir: Path, ca_key_path: Path) -> bytes:
    """The same certificate, re-issued by the cluster CA, expired yesterday."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    from letsinfer.trust import pki

    cert = pki.load_cert(cert_pem)
    ca = pki.load_cert((ca_dir / "ca.crt").read_bytes())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(ca.subject)
        .public_key(cert.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=3))
        .not_valid_after(now - dt.timedelta(days=1))
    )
    for ext in cert.extensions:
        builder = builder.add_extension(ext.value, ext.critical)
    return pki.cert_pem(builder.sign(pki.read_private_key(ca_key_path), hashes.SHA256()))


def no_ready_group_holds(scrape: str, tmp: Path) -> set[str]:
    """Evaluate the shipped LetsinferModelWithoutReadyGroup expression with
    promtool over this scrape's series; return the models it is true for."""
    rules = yaml.safe_load((ROOT / "monitoring/alerts.yml").read_text())
    [rule] = [
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "LetsinferModelWithoutReadyGroup"
    ]
    series = re.findall(r"^(letsinfer_model_ready_groups\{[^}]*\}) (\S+)$", scrape, re.M)
    zero = {m: v for m, v in series if float(v) == 0}
    test = {
        "rule_files": [],
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": m, "values": f"{v}x5"} for m, v in series],
                "promql_expr_test": [
                    {
                        "expr": rule["expr"],
                        "eval_time": "3m",
                        "exp_samples": [{"labels": m, "value": 0} for m in zero],
                    }
                ],
            }
        ],
    }
    (tmp / "scrape_test.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run(
        ["promtool", "test", "rules", "scrape_test.yml"], capture_output=True, text=True, cwd=tmp
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {re.search(r'model="([^"]*)"', m).group(1) for m in zero}  # type: ignore[union-attr]


def test_doctor_cluster_metrics_and_top_see_the_whole_cluster(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    given_model(c, "shared", SHARED)
    hosts = ("main", "n1", "n2")
    subnet = c.lab.hosts["main"].rsplit(".", 1)[0] + ".0/24"
    rules = c.root / "letsinfer.nft"  # the firewall role's own table, as it renders it
    rules.write_text(render([c.lab.hosts[h] for h in hosts], [c.lab.hosts["main"]], [subnet]))
    [main_dir] = (c.home("main") / "etc/clusters").glob("*")
    main_cert = main_dir / "node.crt"
    saved = main_cert.read_bytes()
    try:
        # Before the firewall is loaded, every member is named for it: a
        # warning, the verdict `doctor` gives on each host, with a fix.
        firewalls = {"firewall main", "firewall n1", "firewall n2"}

        def warned() -> set[str]:
            found = json.loads(c.ok("main", "doctor", "--cluster", "--json"))["findings"]
            return {f["check"] for f in found if f["level"] == "warn"}

        _, failed = doctor_cluster(c)
        assert firewalls <= warned() and not firewalls & set(failed)
        for h in hosts:
            loaded = c.lab.run(h, "nft", "-f", str(rules))
            assert loaded.returncode == 0, loaded.stderr
        c.wait(lambda: doctor_cluster(c) == (0, {}), "doctor --cluster to pass", timeout=60)
        c.wait(lambda: not firewalls & warned(), "every member firewalled", timeout=60)
        report = json.loads(c.ok("main", "doctor", "--cluster", "--json"))
        checks = {f["check"] for f in report["findings"]}
        assert {"main", "gpus", "facts n1", "facts n2", "firewall n2", "certificate n1"} <= checks

        # A child's own doctor: its clock against the main's, its certificate, its firewall.
        child = json.loads(c.cli("n1", "doctor", "--json").stdout)
        found = {f["check"]: f for f in child["findings"]}
        assert found["clock"]["level"] == "ok", found["clock"]
        assert f"the main at {c.lab.hosts['main']}:8443" in found["clock"]["message"]
        assert found["certificate"]["level"] == "ok" and found["firewall"]["level"] == "ok"
        assert found["gpu GPU-n1-a"]["level"] == "ok" and "47°C" in found["gpu GPU-n1-a"]["message"]

        # Metrics: the new series for the main and its children.
        assert load(c, "shared", n=4) == [200] * 4
        # Metrics read the main's in-memory view, which takes in accepted facts at
        # most every couple of seconds; doctor reads the authority itself, so the
        # firewall just loaded may reach the scrape a moment after doctor saw it.
        firewall_seen = 'letsinfer_node_firewall_loaded{node="n2"} 1.0'
        c.wait(lambda: firewall_seen in metrics(c), "the scrape to show n2's firewall", timeout=20)
        scrape = metrics(c)
        for series in (
            'letsinfer_model_ready_groups{model="shared"} 2.0',
            'letsinfer_model_groups{model="shared"} 2.0',
            'letsinfer_node_info{node="n1",role="child"} 1.0',
            'letsinfer_node_info{node="main",role="main"} 1.0',
            'letsinfer_node_firewall_loaded{node="n2"} 1.0',
            'letsinfer_gpu_temperature_celsius{gpu="GPU-n1-a",node="n1"} 47.0',
            'letsinfer_gpu_power_watts{gpu="GPU-n1-b",node="n1"} 310.5',
            'letsinfer_key_requests_total{key="default"}',
            'letsinfer_gateway_queue_depth{model="shared"} 0.0',
        ):
            assert series in scrape, series
        for name in (
            "letsinfer_group_state",
            "letsinfer_group_restarts_total",
            "letsinfer_group_free_slots",
            "letsinfer_group_tokens_total",
            "letsinfer_key_tokens_total",
            "letsinfer_node_facts_age_seconds",
            "letsinfer_node_certificate_expiry_seconds",
            "letsinfer_gpu_memory_free_bytes",
        ):
            assert re.search(rf"^{name}\{{", scrape, re.M), name
        for n in ("n1", "n2"):
            assert re.search(
                rf'^letsinfer_group_state\{{desired="running",model="shared",node="{n}",'
                r'pg="pg-\w+",state="ready"\} 1.0$',
                scrape,
                re.M,
            ), n
        assert c.key and c.key not in scrape  # never key material

        # top: the same numbers, as tables
        top = c.lab.run(
            "main",
            PY,
            *("-m", "letsinfer", "--home", str(c.home("main")), "top", "--once"),
            *("--interval", "0.5"),
            env={**c.env("main"), "COLUMNS": "200"},
        )
        assert top.returncode == 0, top.stderr
        for word in ("shared", "n1", "n2", "GPU-n1-a", "loaded", "ready"):
            assert word in top.stdout, (word, top.stdout)

        # An expired certificate is named (the main's, as the next start would present it).
        # The running main renews its own expired certificate every few rounds: a
        # doctor run during which the file was renewed says nothing of the expired
        # one, so that run is taken again.
        expired = expired_copy(saved, main_dir, c.home("main") / "etc/ca/ca.key")
        for _ in range(5):
            main_cert.write_bytes(expired)
            code, failed = doctor_cluster(c)
            if main_cert.read_bytes() == expired:
                break
        assert main_cert.read_bytes() == expired, "renewed during every doctor run"
        assert code == 1 and "main's certificate expired" in failed["certificate main"], failed
        main_cert.write_bytes(saved)

        # A stopped model makes the "no ready group" rule's expression true.
        c.ok("main", "model", "stop", "shared")
        c.wait(
            lambda: 'letsinfer_model_ready_groups{model="shared"} 0.0' in metrics(c),
            "no ready group of shared in the metrics",
        )
        if shutil.which("promtool"):
            assert "shared" in no_ready_group_holds(metrics(c), tmp_path)
        assert doctor_cluster(c) == (0, {}), "a stopped model is not meant to run"
        c.ok("main", "model", "start", "shared")
    finally:
        main_cert.write_bytes(saved)
        for h in hosts:
            c.lab.run(h, "nft", "delete", "table", "inet", "letsinfer")
    wait_ready(c, "shared", {"n1", "n2"})


def test_gpus_are_exclusive_and_exactly_visible(cluster: Cluster) -> None:
    c = cluster
    given_model(c, "shared", {"n1": SHARED["n1"]})
    # Its subject is big's install (the engine that install starts): big starts
    # absent, GPU-n1-a free (the givens of the tests after use this big).
    given_no_model(c, "big")
    given_gpu_free(c, "n1", "GPU-n1-a")
    c.ok("main", "model", "add", "big", "--gguf", str(c.root / "shared.gguf"), "--no-serve")
    c.ok("main", "model", "install", "big", "--node", "n1", "--gpu", "GPU-n1-a", "--yes")
    wait_ready(c, "big", {"n1"})
    seen = json.loads((c.root / "shim-env.json").read_text())
    assert seen["CUDA_VISIBLE_DEVICES"] == "GPU-n1-a"
    assert pgs(c, "big")["n1"]["gpus"] == ["GPU-n1-a"]

    c.ok("main", "model", "add", "big2", "--gguf", str(c.root / "shared.gguf"), "--no-serve")
    taken = c.cli("main", "model", "install", "big2", "--node", "n1", "--gpu", "GPU-n1-a", "--yes")
    assert taken.returncode == 1
    assert "GPU-n1-a already belongs to an active placement group" in taken.stdout + taken.stderr
    assert pgs(c, "big2") == {}

    before = pgs(c, "shared")
    again = c.cli("main", "model", "install", "shared", "--node", "n1", "--target", "cpu", "--yes")
    assert again.returncode == 1 and "--replace-existing" in again.stderr
    assert {n: pg["id"] for n, pg in pgs(c, "shared").items()} == {
        n: pg["id"] for n, pg in before.items()
    }


def test_a_child_with_work_cannot_move_away(cluster: Cluster) -> None:
    c = cluster
    given_model(c, "shared", {"n1": SHARED["n1"]})
    identity = (c.home("n1") / "etc/node.json").read_text()
    refused = c.cli("n1", "node", "move-into", "--main", f"{c.lab.hosts['n2']}:8443")
    # The main holds n1's placement groups: asked over mutual TLS, it says so.
    assert refused.returncode == 1, refused.stderr
    assert "active placement groups on this node" in refused.stderr
    assert str(pgs(c, "shared")["n1"]["id"]) in refused.stderr
    assert "Nothing changed" in refused.stderr
    assert not (c.home("n1") / "var/move-into.json").exists()
    assert (c.home("n1") / "etc/node.json").read_text() == identity
    [denied] = [r for r in c.audit("n1") if r["action"] == "node.move-into"]
    assert denied["outcome"] == "denied" and "active placement groups" in str(denied["detail"])


def test_a_killed_child_engine_costs_no_request(cluster: Cluster) -> None:
    c = cluster
    given_model(c, "shared", SHARED)
    # As installed (in-process xllamacpp engines): an upgrade before may have left
    # llama-server ones, run under a keeper (killing those is not this test's case).
    given_release(c, "shared", xllamacpp_cpu().id)
    victim = int(pgs(c, "shared")["n1"]["pid"])  # type: ignore[arg-type]
    url = f"http://{c.lab.hosts['main']}:8000"
    client = c.lab.popen(
        "main",
        PY,
        str(ROOT / "tests/load_client.py"),
        url,
        c.key,
        "shared",
        "200",
        "4",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    out, err = client.communicate(timeout=120)
    statuses = json.loads(out)
    assert statuses == [200] * 200, err
    c.wait(
        lambda: (
            pgs(c, "shared")["n1"]["state"] == "ready" and pgs(c, "shared")["n1"]["pid"] != victim
        ),
        "the killed engine to return",
    )


def test_pause_lets_a_stream_finish_and_moves_new_requests(cluster: Cluster) -> None:
    c = cluster
    given_model(c, "shared", SHARED)
    given_model(c, "big", BIG)
    engine_pid = pgs(c, "big")["n1"]["pid"]
    flag = c.root / "paused.flag"
    url = f"http://{c.lab.hosts['main']}:8000"
    stream = c.lab.popen(
        "main",
        PY,
        str(ROOT / "tests/load_client.py"),
        "stream",
        url,
        c.key,
        "big",
        str(flag),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert stream.stdout is not None
    assert stream.stdout.readline().strip() == "STARTED"
    # The CLI asks the child's running agent (admin socket), which asks the main
    # over mutual TLS with the node's key.
    c.ok("n1", "node", "pause")
    try:
        assert ("local:root", "node.pause") in [(r["actor"], r["action"]) for r in c.audit("n1")]
        # The main applied it before answering: no wait before the next requests.
        before = served_by(c, "shared")
        assert load(c, "shared", n=12) == [200] * 12
        served = served_since(c, "shared", before, 12)
        n1_pg, n2_pg = str(pgs(c, "shared")["n1"]["id"]), str(pgs(c, "shared")["n2"]["id"])
        assert served.get(n1_pg, 0) == 0, "a paused node admits nothing new"
        assert served[n2_pg] == 12
        flag.touch()
        out, _ = stream.communicate(timeout=60)
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["status"] == 200 and summary["finish"] == "length"
        assert summary["chunks"] > 100
    finally:
        flag.touch()
        c.ok("main", "node", "resume", "n1")
    c.wait(lambda: load(c, "big", n=2, threads=1) == [200, 200], "n1 admitting again")
    assert pgs(c, "big")["n1"]["pid"] == engine_pid, "pausing never restarts engines"


def test_cluster_stop_refuses_new_requests_and_start_restores_the_same_groups(
    cluster: Cluster,
) -> None:
    c = cluster
    given_model(c, "shared", SHARED)
    given_model(c, "big", BIG)
    before = {m: {n: pg["id"] for n, pg in pgs(c, m).items()} for m in ("shared", "big")}
    c.ok("main", "cluster", "stop", timeout=300)
    refused = load_error(c, "shared")
    assert refused["status"] == 503 and refused["code"] == "system_stopped", refused
    assert refused["retry_after"] is None and refused["health"] == [503, {"status": "stopped"}]
    assert load_error(c, "tiny")["code"] == "system_stopped"
    for host in ("main", "n1", "n2"):  # every engine gone, the GPUs free
        c.wait(lambda h=host: processes_using(c.home(h) / "var/models") == [], f"{host} idle")
    status = json.loads(c.ok("main", "cluster", "status", "--json"))
    assert status["stopped"] and set(status["groups"]) >= {*before["shared"].values()}
    again = c.cli("main", "cluster", "stop")
    assert again.returncode == 1 and "already stopped" in again.stderr

    c.ok("main", "cluster", "start", timeout=300)
    after = {m: {n: pg["id"] for n, pg in pgs(c, m).items()} for m in ("shared", "big")}
    assert after == before
    for m, nodes in after.items():
        assert {pg["state"] for pg in pgs(c, m).values()} == {"ready"}, (m, nodes)
    assert load(c, "shared", n=4) == [200] * 4
    assert not json.loads(c.ok("main", "cluster", "status", "--json"))["stopped"]


def test_a_rolling_cluster_restart_keeps_a_replicated_model_serving(cluster: Cluster) -> None:
    c = cluster
    given_model(c, "shared", SHARED)
    pids = {n: pg["pid"] for n, pg in pgs(c, "shared").items()}
    with streaming(c, "shared") as results:
        c.ok("main", "cluster", "restart", timeout=300)
    assert results and not (bad := broken(results)), (bad, len(results))
    after = pgs(c, "shared")
    assert all(after[n]["pid"] != pids[n] and after[n]["state"] == "ready" for n in pids)


def test_an_upgrade_replaces_one_group_at_a_time_while_a_client_streams(
    cluster: Cluster,
) -> None:
    c = cluster
    given_model(c, "shared", SHARED)
    given_release(c, "shared", xllamacpp_cpu().id)  # as installed: not the shim's release
    old = pgs(c, "shared")
    [first] = {str(pg["release"]) for pg in old.values()}
    new = release_add(c, c.root / "llama-server")
    listed = {r["id"]: r for r in json.loads(c.ok("main", "release", "list", "--json"))}
    assert (
        listed[new]["sha256"] == hashlib.sha256((c.root / "llama-server").read_bytes()).hexdigest()
    )
    assert listed[first]["placement_groups"]

    hook = given_webhook(c)
    with streaming(c, "shared") as results:
        code, result = rollout(c, "upgrade", "shared", "--release", new)
    assert code == 0, result
    assert [g["outcome"] for g in result["placement_groups"]] == ["upgraded", "upgraded"]
    seq = last_audit_seq(c, "model.upgrade", "ok")
    c.wait(lambda: seq in announced(c, hook, "upgrade.finished"), "upgrade.finished")
    assert results and not (bad := broken(results)), (bad, len(results))
    after = pgs(c, "shared")
    assert {str(pg["release"]) for pg in after.values()} == {new}
    assert set(after) == {"n1", "n2"}
    # Each new group started beside the old one (cpu: spare capacity) and served.
    assert not {pg["id"] for pg in after.values()} & {pg["id"] for pg in old.values()}
    assert load(c, "shared", n=4) == [200] * 4


def test_a_failed_upgrade_restores_the_first_group_and_touches_no_other(cluster: Cluster) -> None:
    c = cluster
    given_model(c, "shared", SHARED)
    given_release(c, "shared", release_add(c, c.root / "llama-server"))  # the shim's release
    before = pgs(c, "shared")
    broken = release_add(c, c.root / "llama-server-broken")
    hook = given_webhook(c)
    code, result = rollout(c, "upgrade", "shared", "--release", broken)
    assert code == 1, result
    seq = last_audit_seq(c, "model.upgrade", "failed")
    c.wait(lambda: seq in announced(c, hook, "upgrade.failed"), "upgrade.failed")
    first, second = result["placement_groups"]
    assert first["outcome"] == "restored" and second["outcome"] == "not tried", result
    # The reason came from the child's parked engine, through its signed facts.
    assert "parked" in first["detail"] and "shim broken on purpose" in first["detail"]
    after = pgs(c, "shared")
    for node in ("n1", "n2"):  # the same group, release, engine: exactly as before
        assert [after[node][k] for k in ("id", "release", "pid", "state")] == [
            before[node][k] for k in ("id", "release", "pid", "state")
        ]
    released = json.loads(c.ok("main", "release", "list", "--json"))
    [kept] = [r for r in released if r["id"] == before[first["node"]]["release"]]
    assert kept["sha256"] == hashlib.sha256((c.root / "llama-server").read_bytes()).hexdigest()
    failed = c.cli("main", "model", "upgrade", "shared", "--release", broken, timeout=300)
    assert failed.returncode == 1 and f"{first['group']} on {first['node']}" in failed.stderr
    assert load(c, "shared", n=4) == [200] * 4


def test_rollback_reinstalls_the_release_the_model_ran_before(cluster: Cluster) -> None:
    c = cluster
    # Installed (on xllamacpp), then upgraded to the shim's release: one to go back to.
    given_model(c, "shared", SHARED)
    given_release(c, "shared", release_add(c, c.root / "llama-server"))
    info = json.loads(c.ok("main", "model", "show", "shared", "--json"))
    ran = list(dict.fromkeys(h["release"] for h in info["releases"]))
    assert len(ran) >= 2
    hook = given_webhook(c)
    unknown = c.cli("main", "model", "rollback", "shared", "--to", "llama.cpp-nothing")
    assert unknown.returncode == 1 and "not one model shared ran" in unknown.stderr
    code, result = rollout(c, "rollback", "shared")
    assert code == 0, result
    seq = last_audit_seq(c, "model.rollback", "ok")
    c.wait(lambda: seq in announced(c, hook, "rollback.finished"), "rollback.finished")
    assert {g["to"] for g in result["placement_groups"]} == {ran[0]}
    assert {str(pg["release"]) for pg in pgs(c, "shared").values()} == {ran[0]}
    assert load(c, "shared", n=4) == [200] * 4


def test_without_a_free_gpu_a_group_is_replaced_in_place_and_restored(cluster: Cluster) -> None:
    c = cluster
    # n1 keeps one GPU free: big and warm (stopped) hold the others, bytes none.
    given_model(c, "big", BIG)
    given_model(c, "warm", {"n1": WARM["n1"]}, running=False)
    given_no_model(c, "bytes")
    c.ok("main", "model", "add", "gpu2", "--gguf", str(c.root / "shared.gguf"), "--no-serve")
    gpu = free_gpu(c, "n1")  # the last one: big and warm hold the others
    c.ok("main", "model", "install", "gpu2", "--node", "n1", "--gpu", gpu, "--yes")
    wait_ready(c, "gpu2", {"n1"})  # now n1 has no GPU left
    before = pgs(c, "gpu2")["n1"]
    broken = release_add(c, c.root / "llama-server-broken", "cuda")
    code, result = rollout(c, "upgrade", "gpu2", "--release", broken)
    assert code == 1, result
    [group] = result["placement_groups"]
    assert group["outcome"] == "restored" and group["now"] == before["id"], group
    assert "shim broken on purpose" in group["detail"]
    after = pgs(c, "gpu2")["n1"]
    assert (after["id"], after["release"], after["gpus"], after["state"]) == (
        before["id"],
        before["release"],
        [gpu],
        "ready",
    )
    assert load(c, "gpu2", n=2, threads=1) == [200, 200]

    # Removing it (with a group on a child) frees the GPU for the tests after this.
    refused = c.cli("main", "model", "remove", "gpu2")
    assert refused.returncode == 1 and "--stop" in refused.stderr
    c.ok("main", "model", "remove", "gpu2", "--stop", timeout=120)
    assert load(c, "gpu2", n=1, threads=1) == [404]
    topo = json.loads(c.ok("main", "topology", "--json"))
    [n1] = [n for n in topo if n["name"] == "n1"]
    assert {g["uuid"]: g["placement_group"] for g in n1["gpus"]}[gpu] is None


def test_restarting_a_child_keeps_its_engines_serving_a_stream(cluster: Cluster) -> None:
    c = cluster
    given_model(c, "big", BIG)
    engine_pid = pgs(c, "big")["n1"]["pid"]
    flag = c.root / "restart.flag"
    url = f"http://{c.lab.hosts['main']}:8000"
    stream = c.lab.popen(
        "main",
        *(PY, str(ROOT / "tests/load_client.py"), "stream", url, c.key, "big", str(flag)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert stream.stdout is not None
    assert stream.stdout.readline().strip() == "STARTED"
    old = c.procs["n1"].pid
    out = " ".join(c.restart("n1").split())
    assert f"restarted (pid {old} -> " in out and "kept serving" in out and "replaced" not in out
    flag.touch()  # the stream (main gateway -> n1's engine) goes on
    out, err = stream.communicate(timeout=60)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == 200 and summary["finish"] == "length", err
    assert summary["chunks"] > 100
    assert pgs(c, "big")["n1"]["pid"] == engine_pid, "the engine was never restarted"
    assert load(c, "big", n=2, threads=1) == [200, 200]
    assert "adopted the running engine" in (c.home("n1") / "var/logs/node.log").read_text()


def test_cleanup_frees_only_a_stopped_groups_model_and_start_fetches_it_again(
    cluster: Cluster,
) -> None:
    c = cluster
    given_model(c, "shared", {"n2": SHARED["n2"]})  # running on n2 beside spare
    spare = c.root / "spare.gguf"  # a model of its own bytes (another name inside)
    spare.write_bytes((c.root / "shared.gguf").read_bytes().replace(b"-tiny", b"-spar", 1))
    digest = hashlib.sha256(spare.read_bytes()).hexdigest()
    c.ok("main", "model", "add", "spare", "--gguf", str(spare), "--no-serve")
    c.ok("main", "model", "install", "spare", "--node", "n2", "--target", "cpu", "--yes")
    wait_ready(c, "spare", {"n2"})
    models = c.home("n2") / "var/models/sha256"
    stored = models / f"{digest}.gguf"
    kept = {p.name: p.read_bytes() for p in models.glob("*.gguf")}
    assert stored.name in kept and len(kept) == 2  # spare's and shared's (running there)
    c.ok("main", "model", "stop", "spare")
    c.wait(lambda: processes_using(stored) == [], "spare's engine to stop")
    # Links inside n2's home to files outside it: listed, never followed.
    outside = c.root / "outside"
    outside.mkdir()
    (outside / "precious.gguf").write_bytes(b"GGUF" + b"\0" * 4096)
    (models / f"{'0' * 64}.gguf").symlink_to(outside / "precious.gguf")
    (c.home("n2") / "var/elsewhere").symlink_to(outside)

    def spare_stopped_on_n2() -> dict[str, object]:
        usage = json.loads(c.ok("n2", "node", "usage", "--json"))
        return next(m for m in usage["models"] if m["digest"] == digest)

    c.wait(lambda: not spare_stopped_on_n2()["in_use"], "n2 to hear spare stopped")
    usage = json.loads(c.ok("n2", "node", "usage", "--json"))
    by_digest = {m["digest"]: m for m in usage["models"]}
    assert set(by_digest) == {p.removesuffix(".gguf") for p in kept}
    assert "stopped" in by_digest[digest]["why"] and "model start spare" in by_digest[digest]["why"]
    [running] = [m for d, m in by_digest.items() if d != digest]
    assert running["in_use"] and "running" in running["why"]
    links = {link["path"]: link["points_to"] for link in usage["symlinks"]}
    assert links[f"var/models/sha256/{'0' * 64}.gguf"] == str(outside / "precious.gguf")
    assert links["var/elsewhere"] == str(outside)
    # On the main, a model's source file is never free to go: nodes fetch it there.
    main_usage = json.loads(c.ok("main", "node", "usage", "--json"))
    [source] = [m for m in main_usage["models"] if m["digest"] == digest]
    assert source["in_use"] and not source["releasable"] and "source" in source["why"]

    review = " ".join(c.ok("n2", "node", "cleanup").split())
    assert f"var/models/sha256/{digest}.gguf" in review and "--yes" in review
    assert stored.exists(), "without --yes nothing is freed"
    done = json.loads(c.ok("n2", "node", "cleanup", "--yes", "--json"))
    freed = [str(r["path"]) for r in done["freed"]]
    assert f"var/models/sha256/{digest}.gguf" in freed, freed
    # Besides it, only the logs of groups gone from n2 (earlier tests removed some).
    live = {
        str(pg["id"])
        for m in json.loads(c.ok("main", "model", "list", "--json"))
        for pg in m["placement_groups"]
    }
    for path in set(freed) - {f"var/models/sha256/{digest}.gguf"}:
        assert path.startswith("var/logs/engines/pg-") and path.endswith(".log"), path
        assert Path(path).stem not in live, path
    assert not stored.exists()
    assert {p.name: p.read_bytes() for p in models.glob("*.gguf") if not p.is_symlink()} == {
        n: b for n, b in kept.items() if n != stored.name
    }
    assert (outside / "precious.gguf").read_bytes() == b"GGUF" + b"\0" * 4096
    assert (models / f"{'0' * 64}.gguf").is_symlink() and (
        c.home("n2") / "var/elsewhere"
    ).is_symlink()
    assert ("node.cleanup", "ok") in [(r["action"], r["outcome"]) for r in c.audit("n2")]

    # Started again: n2 downloads the exact file again, verifies it, then serves.
    started = " ".join(c.ok("main", "model", "start", "spare").split())
    assert f"n2 downloads sha256:{digest} again" in started, started
    wait_ready(c, "spare", {"n2"})
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == digest
    assert load(c, "spare", n=2, threads=1) == [200, 200]
    c.ok("main", "model", "stop", "spare")


def test_forged_replayed_and_stale_facts_are_refused_and_audited(cluster: Cluster) -> None:
    c = cluster
    home = c.home("n1")
    script = (
        as_node(home)
        + f"""
import base64, time, httpx
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from letsinfer.contracts.facts import Facts, sign
def facts(seq, ts):
    return Facts(node_id=node_id, seq=seq, ts=ts, cpus=1, memory_bytes=1, targets=["cpu"],
                 version="x")
def raw(**change):
    # Signed with the node's own key: an enrolled node sending absurd values.
    body = dict(node_id=node_id, seq=int(time.time() * 1000), ts=time.time(), cpus=1,
                memory_bytes=1, targets=["cpu", "evil"], version="x")
    body.update(change)
    data = json.dumps(body)  # NaN and Infinity as Python writes them
    sig = key.sign(data.encode(), ec.ECDSA(hashes.SHA256()))
    return {{"facts": data, "signature": base64.b64encode(sig).decode()}}
gpu = dict(uuid="GPU-x", name="x", memory_total=1, memory_free=1)
out = {{}}
with httpx.Client(verify=ctx, timeout=10) as client:
    url = "https://{c.lab.hosts["main"]}:8443/v1/agent/facts"
    for name, env in (("forged", sign(facts(int(time.time() * 1000) + 10**6, time.time()),
                                       pki.new_key())),
                      ("replayed", sign(facts(1, time.time()), key)),
                      ("stale", sign(facts(int(time.time() * 1000) + 10**7, time.time() - 3600),
                                     key)),
                      ("ts NaN", raw(ts=float("nan"))),
                      ("ts Infinity", raw(ts=float("inf"))),
                      ("power Infinity", raw(gpus=[dict(gpu, power_w=float("inf"))])),
                      ("huge int", raw(cpus=10**30)),
                      ("huge memory", raw(memory_bytes=2**70)),
                      ("oversized string", raw(version="v" * 100_000)),
                      ("oversized target", raw(targets=["cpu" * 50]))):
        r = client.post(url, json=env)
        out[name] = [r.status_code, r.json()["error"]["message"]]
print(json.dumps(out))
"""
    )
    result = json.loads(c.py("n1", script))
    assert result["forged"][0] == 422 and "signature does not verify" in result["forged"][1]
    assert result["replayed"][0] == 422 and "replayed" in result["replayed"][1]
    assert result["stale"][0] == 422 and "stale" in result["stale"][1]
    for name, field in (
        ("ts NaN", "ts"),
        ("ts Infinity", "ts"),
        ("power Infinity", "gpus.0.power_w"),
        ("huge int", "cpus"),
        ("huge memory", "memory_bytes"),
        ("oversized string", "version"),
        ("oversized target", "targets.0"),
    ):
        status, message = result[name]
        assert status == 422 and f"facts out of bounds or malformed ({field}:" in message, (
            name,
            result[name],
        )

    def refusals() -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in c.audit("main"):
            if r["action"] == "node.facts" and r["outcome"] == "denied":
                counts[str(r["detail"])] = counts.get(str(r["detail"]), 0) + int(r["count"] or 1)
        return counts

    wanted = {
        "the facts' signature does not verify with this node's key",
        "replayed facts",
        "stale facts",
        "facts out of bounds or malformed (ts)",
        "facts out of bounds or malformed (gpus.0.power_w)",
        "facts out of bounds or malformed (cpus)",
        "facts out of bounds or malformed (memory_bytes)",
        "facts out of bounds or malformed (version)",
        "facts out of bounds or malformed (targets.0)",
    }
    c.wait(lambda: wanted <= set(refusals()), "every refusal in the main's audit chain")
    # NaN and Infinity, counted. Both in the first record when they came within
    # the writer's gathering; else the second waits in its window, written
    # when the window ends (60 s here).
    c.wait(
        lambda: refusals()["facts out of bounds or malformed (ts)"] == 2,
        "both malformed timestamps counted in the audit chain",
        timeout=90,
    )
    # Never stored: the main's view of n1 holds none of the refused values.
    topology = c.ok("main", "topology", "--json")
    assert "evil" not in topology and "1e+30" not in topology


def test_a_stopped_child_becomes_unroutable_and_traffic_moves(cluster: Cluster) -> None:
    c = cluster
    given_model(c, "shared", SHARED)
    # n2 stays stopped: the givens of the tests that need it start it again.
    proc = c.procs.pop("n2")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert processes_using(c.home("n2") / "var/models") == [], "its engines stop with it"

    def n2_unroutable() -> bool:
        return routed(c)["shared"] == 1

    c.wait(n2_unroutable, "the main to drop n2's placement group", timeout=15)
    assert load(c, "shared", n=8) == [200] * 8
    nodes = {n["name"]: n for n in json.loads(c.ok("main", "node", "list", "--json"))}
    c.wait(
        lambda: (
            {n["name"]: n for n in json.loads(c.ok("main", "node", "list", "--json"))}["n2"][
                "state"
            ]
            == "unreachable"
        ),
        "n2 listed as unreachable",
    )
    assert nodes["n1"]["state"] == "active"
    # doctor --cluster names the child whose facts stopped, and its group
    done = c.cli("main", "doctor", "--cluster")
    assert done.returncode == 1
    assert "n2 sent no facts for" in done.stdout and "its node's facts are stale" in done.stdout

    # Its agent stopped, n2 still cannot move away: the CLI asks the main itself.
    refused = c.cli("n2", "node", "move-into", "--main", f"{c.lab.hosts['n1']}:8443")
    assert refused.returncode == 1 and str(pgs(c, "shared")["n2"]["id"]) in refused.stderr


def test_a_replaced_llama_server_binary_is_refused_until_released_again(cluster: Cluster) -> None:
    c = cluster
    binary = c.root / "llama-server"  # the shim n1 runs for GPU placements
    shim = binary.read_bytes()
    # Its subject starts at bytes' install: no bytes before (a test before may
    # have placed one).
    given_no_model(c, "bytes")
    c.ok("main", "model", "add", "bytes", "--gguf", str(c.root / "shared.gguf"), "--no-serve")
    gpu = free_gpu(c, "n1")
    c.ok("main", "model", "install", "bytes", "--node", "n1", "--gpu", gpu, "--yes")
    wait_ready(c, "bytes", {"n1"})
    first = pgs(c, "bytes")["n1"]
    released = hashlib.sha256(binary.read_bytes()).hexdigest()
    assert load(c, "bytes", n=2, threads=1) == [200, 200]
    try:
        c.ok("main", "model", "stop", "bytes")
        c.wait(lambda: not Path(f"/proc/{first['pid']}").exists(), "the engine to stop")
        with binary.open("a") as fh:  # the same path, other bytes
            fh.write("# rebuilt\n")
        now = hashlib.sha256(binary.read_bytes()).hexdigest()
        c.ok("main", "model", "start", "bytes")
        c.wait(lambda: pgs(c, "bytes")["n1"]["state"] == "failed", "n1 to refuse the binary")
        detail = str(pgs(c, "bytes")["n1"]["detail"])
        assert str(binary) in detail and released in detail and now in detail, detail
        assert "refused to run" in detail and "--replace-existing" in detail
        assert load(c, "bytes", n=1, threads=1) == [503]

        # Released again: a new release of the binary as it is now, which serves.
        c.ok(
            "main",
            *("model", "install", "bytes", "--node", "n1", "--gpu", gpu),
            *("--replace-existing", "--yes"),
        )
        wait_ready(c, "bytes", {"n1"})
        assert pgs(c, "bytes")["n1"]["release"] != first["release"]
        assert load(c, "bytes", n=2, threads=1) == [200, 200]
    finally:
        # The shim as every other release has it; bytes (a release of the
        # rebuilt one) goes with its GPU: the givens place it again where needed.
        binary.write_bytes(shim)
        given_no_model(c, "bytes")


def test_removing_a_child_takes_its_work_and_a_wiped_host_rejoins(cluster: Cluster) -> None:
    c = cluster
    given_model(c, "shared", {"n1": SHARED["n1"]})
    given_model(c, "big", BIG)
    given_model(c, "bytes", {"n1": lambda: ["--gpu", free_gpu(c, "n1")]})
    given_only_running_on(c, "n1", {"shared", "big", "bytes"})  # the engines it stops
    assert load(c, "big", n=2, threads=1) == [200, 200]
    on_n1 = {m: str(pgs(c, m)["n1"]["id"]) for m in ("shared", "big", "bytes")}
    engines = processes_using(c.home("n1") / "var/models")
    assert engines
    old = c.root / "n1-removed"  # what an attacker holding the old identity keeps
    shutil.copytree(c.home("n1") / "etc", old / "etc")
    # Another member cannot tell n1 it was removed: only n1's main may.
    forged = c.py(
        "n2",
        as_node(c.home("n2"))
        + f"""
import httpx
r = httpx.post("https://{c.lab.hosts["n1"]}:8444/v1/agent/removed", verify=ctx, timeout=10)
print(r.status_code, r.text)
""",
    )
    assert forged.startswith("403") and "only this node's main" in forged, forged
    assert sorted(processes_using(c.home("n1") / "var/models")) == sorted(engines)

    out = c.ok("main", "node", "remove", "n1")
    assert all(pg in out for pg in on_n1.values()), out
    assert f"stopped {len(on_n1)} engine(s)" in out, out  # a binary's keeper is one more process
    # At once: no route, no placement group (nor its GPU claims), no engine.
    assert load(c, "big", n=2, threads=1) == [503, 503]
    for model in on_n1:
        assert "n1" not in pgs(c, model)
    assert processes_using(c.home("n1") / "var/models") == []
    main_audit = [(r["action"], r["outcome"]) for r in c.audit("main")]
    assert ("node.remove", "ok") in main_audit and ("node.remove.notify", "ok") in main_audit
    assert ("node.removed", "ok") in [(r["action"], r["outcome"]) for r in c.audit("n1")]
    assert "n1" not in {n["name"] for n in json.loads(c.ok("main", "node", "list", "--json"))}
    [row] = [
        n for n in json.loads(c.ok("main", "node", "list", "--all", "--json")) if n["name"] == "n1"
    ]
    assert row["state"] == "removed" and row["removed_at"]
    again = c.cli("main", "node", "remove", "n1")
    assert again.returncode == 1 and "already removed" in again.stderr
    # Told again (as when the main's refusal of n1's report reached it first), n1
    # answers with the engines that removal stopped, not with zero.
    repeat = c.py(
        "main",
        as_node(c.home("main"))
        + f"""
import httpx
r = httpx.post("https://{c.lab.hosts["n1"]}:8444/v1/agent/removed", verify=ctx, timeout=10)
print(r.status_code, r.json()["engines_stopped"])
""",
    )
    assert repeat.split() == ["200", str(len(on_n1))], repeat

    # Wiped and initialised again, the host enrolls under its name: a new identity.
    proc = c.procs.pop("n1")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    shutil.rmtree(c.home("n1"))
    c.ok("n1", "node", "init", "--name", "n1")
    c.up("n1")
    c.enroll("n1")

    def n1_back() -> dict[str, object] | None:
        nodes = json.loads(c.ok("main", "node", "list", "--json"))
        return next((n for n in nodes if n["name"] == "n1" and n["state"] == "active"), None)

    c.wait(lambda: n1_back() is not None, "n1 enrolled again")
    back = n1_back()
    assert back is not None and back["id"] != row["id"]
    assert back["fingerprint"] != row["fingerprint"]
    # Its GPUs are free for another install, and it serves again.
    c.ok("main", "model", "install", "big", "--node", "n1", "--gpu", "GPU-n1-a", "--yes")
    wait_ready(c, "big", {"n1"})
    assert load(c, "big", n=2, threads=1) == [200, 200]

    # The old certificate stays refused.
    script = (
        as_node(old)
        + f"""
import time, httpx
from letsinfer.contracts.facts import Facts, sign
facts = Facts(node_id=node_id, seq=int(time.time() * 1000), ts=time.time(), cpus=1,
              memory_bytes=1, targets=["cpu"], version="x")
r = httpx.post("https://{c.lab.hosts["main"]}:8443/v1/agent/facts", json=sign(facts, key),
               verify=ctx, timeout=10)
print(r.status_code, r.text)
"""
    )
    answer = c.py("n1", script)
    assert answer.startswith("403") and "removed" in answer and "revoked" in answer, answer


def test_a_cut_or_rewritten_child_chain_fails_verify_there_and_on_the_main(
    cluster: Cluster,
) -> None:
    """A writer of n1's database (not of its etc/) cuts its audit chain, then
    rewrites it with every later hash recomputed: n1's own `audit verify` names
    it, and so does the main's, from the signed head n1 reports with its facts."""
    c = cluster
    db = c.home("n1") / "var/authority.db"
    with sqlite3.connect(db) as conn:
        saved = conn.execute("SELECT * FROM audit ORDER BY seq").fetchall()
    last = int(saved[-1][0])

    def main_verify() -> str:
        done = c.cli("main", "audit", "verify")
        return done.stderr if done.returncode else "intact"

    assert main_verify() == "intact"
    hook = given_webhook(c)
    try:
        cut_audit(db, keep=last - 2)
        cut = c.cli("n1", "audit", "verify")
        assert cut.returncode == 1
        assert f"the chain was cut: the signed head covers {last} records" in cut.stderr
        c.wait(lambda: "node n1's audit chain: the chain was cut" in main_verify(), "the main")

        put_back(db, saved)  # a sound chain again: the main stops naming n1
        c.wait(lambda: main_verify() == "intact", "the main clearing n1")

        rewrite_audit_from(db, 2, "nothing happened here")
        rewritten = c.cli("n1", "audit", "verify")
        assert rewritten.returncode == 1 and "broken at record" not in rewritten.stderr
        assert f"record {last} differs from the signed head: the chain was rewritten" in (
            rewritten.stderr
        )
        c.wait(
            lambda: (
                "node n1's audit chain: record" in main_verify() and "rewritten" in main_verify()
            ),
            "the main naming n1",
        )
    finally:
        put_back(db, saved)
    c.wait(lambda: main_verify() == "intact", "the main clearing n1")
    flagged = [r for r in c.audit("main") if r["action"] == "node.audit-head"]
    assert {r["outcome"] for r in flagged} == {"flagged"} and len(flagged) >= 2
    # Each flag is a webhook event (the cut, then the rewrite).
    seqs = {int(str(r["seq"])) for r in flagged[-2:]}
    c.wait(lambda: seqs <= announced(c, hook, "audit.tampering"), "audit.tampering")


def _restart_main(c: Cluster, sig: int = signal.SIGTERM, **env: str) -> None:
    main = c.procs.pop("main")
    main.send_signal(sig)
    main.wait(timeout=30)
    c.extra_env["main"] = {
        k: v for k, v in c.extra_env["main"].items() if k != "LETSINFER_CONTROL__REPORT_COST_S"
    }
    c.extra_env["main"].update(env)
    c.up("main")


def _slow_main(c: Cluster) -> None:
    """Each node's facts cost the main a second inside their batch's transaction
    (a test seam), and n2 says nothing of its own (stopped: the givens of the
    tests that need it start it again)."""
    proc = c.procs.pop("n2", None)
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    if "LETSINFER_CONTROL__REPORT_COST_S" not in c.extra_env["main"]:
        _restart_main(c, LETSINFER_CONTROL__REPORT_COST_S="1.0")


def _plain_main(c: Cluster) -> None:
    """The main without the seam (restarted if it had it), once it routes what it
    routed before."""
    if "LETSINFER_CONTROL__REPORT_COST_S" not in c.extra_env["main"]:
        return
    before = routed(c)
    _restart_main(c)
    c.wait(
        lambda: all(routed(c).get(m, 0) >= k for m, k in before.items()),
        "the main routing again what it routed before",
        timeout=60,
    )


def _write_locked(db: Path) -> bool:
    """Whether a write transaction is open on the database now (a batch)."""
    conn = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc)
    else:
        conn.execute("ROLLBACK")
        return False
    finally:
        conn.close()


def test_an_overloaded_main_sheds_reports_and_no_node_goes_stale(cluster: Cluster) -> None:
    """The main's report handling made slow (a test seam: each node's facts
    cost a second inside their batch's transaction, the control loop blocked
    meanwhile): it answers n1's reports 503 with Retry-After instead of letting
    them time out, n1's agent waits as told (spread), and n1 is never shown
    unreachable nor its group taken out of routing."""
    c = cluster
    given_model(c, "big", BIG)
    n1_log = c.root / "n1.log"
    before = len(n1_log.read_text())
    try:
        _plain_main(c)  # restarted with the seam, not left slow by a test before
        _slow_main(c)
        c.wait(lambda: load(c, "big", n=1, threads=1) == [200], "n1's group routed again")
        states: set[str] = set()
        deadline = time.monotonic() + 12  # four times the main's stale window
        while time.monotonic() < deadline:
            states |= {
                n["state"]
                for n in json.loads(c.ok("main", "node", "list", "--json"))
                if n["name"] == "n1"
            }
            time.sleep(0.5)
        assert states == {"active"}, states
        assert load(c, "big", n=4, threads=2) == [200] * 4
        main_log = (c.root / "main.log").read_text()
        assert "control plane: falling behind" in main_log, main_log[-3000:]
        assert "is stale" not in main_log
        told = re.findall(
            r"is busy \(503, Retry-After (\d+)s\): next report in ([\d.]+)s",
            n1_log.read_text()[before:],
        )
        assert told, "n1's agent heard 503s"
        for after, wait in told:  # as long as it was told, spread by up to a half
            assert float(after) <= float(wait) <= 1.5 * float(after) + 0.05, (after, wait)
        # Spread, not all alike: shown once n1 heard a few 503s (how many the main
        # sheds varies with the machine's load; a single one shows nothing). The
        # spread's own bounds: tests/test_scale.py, with the draws fixed.
        if len(told) >= 3:
            assert len({wait for _, wait in told}) > 1, ("jittered", told)
        scrape = c.py(
            "main", 'import httpx; print(httpx.get("http://127.0.0.1:9400/metrics").text)'
        )
        shed = re.search(r"^letsinfer_control_reports_shed_total (\S+)$", scrape, re.M)
        assert shed is not None and float(shed.group(1)) >= len(told)
    finally:
        _plain_main(c)


def test_a_kill_mid_batch_loses_no_enrollment_key_or_audit_record_and_replays_stay_refused(
    cluster: Cluster,
) -> None:
    """With reports written in batches (each held open a second by the seam),
    the main is killed (SIGKILL) while a batch's transaction is open. What it
    had answered survives: an enrollment, an API key, their audit records and
    an accepted facts envelope, which is still refused as a replay."""
    c = cluster
    main_addr = c.lab.hosts["main"]
    url = f"https://{main_addr}:8443/v1/agent/facts"
    given_model(c, "big", BIG)
    _slow_main(c)
    try:
        capture = (
            as_node(c.home("n2"))
            + f"""
import time, httpx
from letsinfer.contracts.facts import Facts, sign
while True:  # the main sheds some reports now: until one is taken
    # Dated 25 s ahead (the main allows 30 s either way): a slow restart still
    # finds the replay within the clock bound, so only its sequence refuses it.
    facts = Facts(node_id=node_id, seq=int(time.time() * 1000), ts=time.time() + 25, cpus=1,
                  memory_bytes=1, targets=["cpu"], version="x")
    envelope = sign(facts, key)
    r = httpx.post("{url}", json=envelope, verify=ctx, timeout=30)
    if r.status_code != 503:
        break
    time.sleep(float(r.headers["retry-after"]))
print(json.dumps([r.status_code, envelope]))
"""
        )
        status, envelope = json.loads(c.py("n2", capture))
        assert status == 200
        key = json.loads(
            c.ok("main", "auth", "key", "create", "survivor", "--model", "big", "--json")
        )
        enroll = f"""
import json, uuid, httpx
from pathlib import Path
from letsinfer.authority import enrollment
from letsinfer.audit.anchor import open_authority
from letsinfer.home import Home
from letsinfer.identity import load_identity
from letsinfer.trust import pki
from letsinfer.trust.peer import client_context
home = Home.under(Path("{c.home("main")}"))
ca = home.cluster_dir(load_identity(home.identity_file).cluster) / "ca.crt"
store = open_authority(home)
key = pki.new_key()
node_id = uuid.uuid4().hex
offer = enrollment.open_offer(store, node_id, "late", "10.9.9.9:8444",
                              pki.public_key_fingerprint(key.public_key()), 600)
store.close()
r = httpx.post("https://{main_addr}:8443/v1/enroll/complete", verify=client_context(ca),
               timeout=30, json={{"enrollment_id": offer.record.id, "token": offer.token,
                                  "csr": pki.make_csr(key, node_id).decode()}})
print(json.dumps([r.status_code, node_id]))
"""
        status, late_id = json.loads(c.py("main", enroll))
        assert status == 200
        db = c.home("main") / "var/authority.db"
        c.wait(lambda: _write_locked(db), "a batch's transaction open", timeout=30)
        _restart_main(c, signal.SIGKILL)  # in the middle of that batch

        # The replay first: the envelope's time must still be within the clock bound.
        replay = (
            as_node(c.home("n2"))
            + f"""
import httpx
r = httpx.post("{url}", json={envelope!r}, verify=ctx, timeout=10)
print(json.dumps([r.status_code, r.json()["error"]["message"]]))
"""
        )
        status, message = json.loads(c.py("n2", replay))
        assert status == 422 and "replayed facts" in message, message

        nodes = {n["name"]: n for n in json.loads(c.ok("main", "node", "list", "--all", "--json"))}
        late = nodes["late"]
        assert late["id"] == late_id and late["fingerprint"], "enrolled, its certificate recorded"
        assert late["state"] == "unreachable", "a member that never reported (a stand-in here)"
        assert "survivor" in {
            k["name"] for k in json.loads(c.ok("main", "auth", "key", "list", "--json"))
        }
        # A restarted main routes to n1's group once n1 has reported to it again.
        c.wait(lambda: load_error_with(c, "big", key["key"]) == 200, "n1's group routed again")
        done = [(r["action"], r["target"]) for r in c.audit("main")]
        assert ("auth.key.create", "survivor") in done and ("node.enroll.complete", "late") in done
        verified = c.cli("main", "audit", "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr

        n2_id = json.loads((c.home("n2") / "etc/node.json").read_text())["node_id"]
        c.wait(
            lambda: any(
                (r["actor"], r["action"], r["detail"])
                == (f"node:{n2_id}", "node.facts", "replayed facts")
                for r in c.audit("main")
            ),
            "the main auditing the replay",
        )
    finally:
        # The stand-in never reports: left enrolled, `doctor --cluster` would name it.
        c.cli("main", "node", "remove", "late", timeout=120)
        # A key for big alone would keep big from being removed.
        c.cli("main", "auth", "key", "revoke", "survivor")
        _plain_main(c)


def load_error_with(c: Cluster, model: str, key: str) -> int:
    """One chat request through the main's gateway with ``key``: its status."""
    main = c.lab.hosts["main"]
    out = c.py(
        "main",
        f"""
import httpx
r = httpx.post("http://{main}:8000/v1/chat/completions", timeout=30,
               headers={{"authorization": "Bearer {key}"}},
               json={{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}})
print(r.status_code)
""",
    )
    return int(out.strip())


# Eight clients asking for one model as fast as they can for SECONDS, and on
# until one answers UNTIL (at most 120 s in all; a refusal paces its client by
# 0.1 s, so a slow machine's restarting engine gets the cores); prints each
# answer's (status, text or error code).
_HAMMER = r"""
import httpx, json, sys, threading, time
url, key, model, seconds, until = sys.argv[1:6]
out, lock, seen = [], threading.Lock(), threading.Event()
end, give_up = time.time() + float(seconds), time.time() + 120
ask = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
def run():
    with httpx.Client(timeout=30) as client:
        while time.time() < give_up and (time.time() < end or not seen.is_set()):
            try:
                r = client.post(url + "/v1/chat/completions", json=ask,
                                headers={"authorization": "Bearer " + key})
                body = r.json()
                ok = r.status_code == 200
                text = body["choices"][0]["message"]["content"] if ok else body["error"]["code"]
                status = r.status_code
            except Exception as exc:
                status, text = 0, type(exc).__name__
            with lock:
                out.append((status, text))
            if status == 200 and text == until:
                seen.set()
            elif status != 200:
                time.sleep(0.1)
threads = [threading.Thread(target=run) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
"""


def test_an_engine_away_while_its_adapter_was_replaced_never_answers_with_the_old_file(
    cluster: Cluster,
) -> None:
    """Replaced under its name while n1 was unreachable: once n1 is back, its
    engine still runs the old file until its agent restarts it. Its facts say
    which file each adapter is, and the main routes none that is not the one
    it holds now. (It stops n1's node for a while: the givens of the tests
    after wait for n1's groups to be ready again.)"""
    c = cluster
    try:
        c.ok("main", "model", "add", "swap", "--gguf", str(c.root / "shared.gguf"), "--no-serve")
        c.ok("main", "model", "install", "swap", "--node", "n1", "--target", "cpu", "--yes")
        wait_ready(c, "swap", {"n1"})
        old = write_tiny_lora(c.root / "swap-old.gguf")
        new = write_tiny_lora(c.root / "swap-new.gguf", inert=True)
        c.ok("main", "model", "adapter", "add", "swap", "swap-t", "--gguf", str(old), timeout=300)
        assert answer(c, "swap-t") == LORA_SENTENCE
        node = c.procs["n1"]
        os.kill(node.pid, signal.SIGSTOP)  # its engine runs on, the old file loaded
        try:
            c.wait(lambda: node_state(c, "n1") == "unreachable", "n1 unreachable", timeout=30)
            c.ok("main", "model", "adapter", "remove", "swap-t", timeout=120)
            c.ok(
                "main", "model", "adapter", "add", "swap", "swap-t", "--gguf", str(new), timeout=120
            )
            # A key with a cache: one answer from the old file would be kept, and
            # then repeated, under the new file's identity.
            made = c.ok("main", "auth", "key", "create", "swap-cache", "--cache-ttl", "300",
                        "--cache-sampled", "--json")  # fmt: skip
            url = f"http://{c.lab.hosts['main']}:8000"
            key = json.loads(made)["key"]
            asking = c.lab.popen(
                "main", PY, "-c", _HAMMER, url, key, "swap-t", "25", SENTENCE, env=c.env("main"),
                stdout=subprocess.PIPE,
            )  # fmt: skip
            time.sleep(2)
        finally:
            os.kill(node.pid, signal.SIGCONT)
        answers = json.loads(asking.communicate(timeout=180)[0])
        texts = [text for status, text in answers if status == 200]
        assert LORA_SENTENCE not in texts, "the removed adapter's file answered under its name"
        assert SENTENCE in texts  # the new file, once n1's engine started afresh with it
    finally:
        given_no_model(c, "swap")  # n1 runs no engine the tests after do not count on


def node_state(c: Cluster, name: str) -> str:
    return {n["name"]: n["state"] for n in json.loads(c.ok("main", "node", "list", "--json"))}[name]
