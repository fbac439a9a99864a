"""A closed inference plane, tried from the LAN: a main, a client host and an
outsider (in no letsinfer group) in network namespaces.

Metrics stay on the main unless exposed, and then reach listed sources only;
/health tells a keyless caller nothing about models; a flood of idle and
slowloris connections neither takes the node down nor stays open; deep JSON
gets a clean 400."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from letsinfer.engines.tinymodel import write_tiny_model
from tests.cluster import PY, Cluster
from tests.netlab import NetLab, can_make_namespaces

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")

ROOT = Path(__file__).resolve().parent.parent
HEADER_TIMEOUT_S = 2
# The node's own file limit, low enough that 20,000 connections would exhaust
# it many times over (the node raises its soft limit to the hard one).
FILE_LIMIT = (1024, 4096)
MAIN_ENV = {
    "LETSINFER_GATEWAY__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
    "LETSINFER_GATEWAY__IDLE_TIMEOUT_S": "2",
    "LETSINFER_ENGINE__THREADS": "1",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    lab = NetLab(["main", "client", "outsider"]).up()
    c = Cluster(lab, tmp_path_factory.mktemp("plane"))
    c.extra_env = {"main": dict(MAIN_ENV)}
    try:
        out = c.ok("main", "node", "init", "--main", "--name", "main")
        c.key = out.split("API key (shown once): ")[1].split()[0]
        c.up("main", file_limit=FILE_LIMIT)
        yield c
    finally:
        c.stop()
        lab.down()


def given_main_with(c: Cluster, settings: dict[str, str]) -> None:
    """The main runs with ``settings`` beside its own (restarted where it runs
    with others: a test before may have exposed its metrics)."""
    wanted = {**MAIN_ENV, **settings}
    if c.extra_env["main"] == wanted:
        return
    proc = c.procs.pop("main")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    c.extra_env["main"] = wanted
    c.up("main", file_limit=FILE_LIMIT)


def get(c: Cluster, host: str, url: str, key: str | None = None) -> dict[str, object]:
    """GET ``url`` from ``host``'s namespace: status and body, or the error."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    out = c.py(
        host,
        f"""
import json, httpx
try:
    r = httpx.get({url!r}, headers={headers!r}, timeout=10)
    print(json.dumps({{"status": r.status_code, "text": r.text}}))
except httpx.HTTPError as exc:
    print(json.dumps({{"status": None, "text": type(exc).__name__}}))
""",
    )
    return json.loads(out)  # type: ignore[no-any-return]


def post(c: Cluster, host: str, url: str, body: str, key: str | None = None) -> dict[str, object]:
    """POST ``body`` from ``host``'s namespace (TLS unverified, no client cert)."""
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    out = c.py(
        host,
        f"""
import json, httpx
r = httpx.post({url!r}, content={body!r}, headers={headers!r}, timeout=30, verify=False)
print(json.dumps({{"status": r.status_code, "body": r.json()}}))
""",
    )
    return json.loads(out)  # type: ignore[no-any-return]


def chat(c: Cluster, host: str, key: str) -> dict[str, object]:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    return post(c, host, f"http://{c.lab.hosts['main']}:8000/v1/chat/completions", body, key)


def test_metrics_stay_on_the_main_by_default(cluster: Cluster) -> None:
    c = cluster
    given_main_with(c, {})
    main = c.lab.hosts["main"]
    for host in ("client", "outsider"):
        assert get(c, host, f"http://{main}:9400/metrics")["status"] is None
    local = get(c, "main", "http://127.0.0.1:9400/metrics")
    assert local["status"] == 200 and "letsinfer_gateway_requests" in str(local["text"])


def test_health_names_models_only_to_a_key_that_may_use_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    write_tiny_model(tmp_path / "other.gguf")
    c.ok("main", "model", "add", "hidden", "--gguf", str(tmp_path / "other.gguf"), "--no-serve")
    only_tiny = json.loads(
        c.ok("main", "auth", "key", "create", "tiny-only", "--model", "tiny", "--json")
    )
    url = f"http://{c.lab.hosts['main']}:8000/health"

    # "hidden" is only registered (--no-serve): not meant to serve, so the
    # gateway stays healthy, and a caller without a key learns no model name.
    anonymous = get(c, "outsider", url)
    assert anonymous["status"] == 200
    assert json.loads(str(anonymous["text"])) == {"status": "ok"}

    def mine() -> object:
        answer = get(c, "client", url, key=str(only_tiny["key"]))
        assert answer["status"] == 200
        return json.loads(str(answer["text"]))

    expected = {"status": "ok", "models": {"tiny": 1}, "states": {"tiny": "serving"}}
    # The main's own engine may still be starting when its planes listen.
    c.wait(lambda: mine()["states"]["tiny"] == "serving", "tiny to serve")  # type: ignore[index]
    assert mine() == expected

    everything = json.loads(str(get(c, "client", url, key=c.key)["text"]))
    assert everything["models"] == {"tiny": 1, "hidden": 0}
    assert everything["states"]["hidden"] == "not placed"
    assert get(c, "outsider", url, key="li-guessed")["status"] == 401


def test_deep_json_gets_a_clean_400_on_every_plane(cluster: Cluster) -> None:
    c = cluster
    main = c.lab.hosts["main"]
    deep = "[" * 5000 + "]" * 5000
    gateway = post(
        c,
        "client",
        f"http://{main}:8000/v1/chat/completions",
        f'{{"model": "tiny", "messages": {deep}}}',
        key=c.key,
    )
    assert gateway["status"] == 400
    assert gateway["body"]["error"]["code"] == "json_too_deep"  # type: ignore[index]
    # The open paths of the mutual-TLS planes take JSON from anyone on the LAN.
    out = c.py(
        "outsider",
        f"""
import json, httpx
for port, path in ((8443, "/v1/enroll/complete"), (8444, "/v1/enroll/request")):
    for depth in (65, 900, 5000):  # past the limit, near and past the parser's own
        body = '{{"token": ' + "[" * depth + "]" * depth + "}}"
        r = httpx.post(f"https://{main}:{{port}}{{path}}", content=body, verify=False,
                       headers={{"content-type": "application/json"}}, timeout=30)
        print(json.dumps([path, depth, r.status_code, r.json()]))
""",
    )
    results = [json.loads(line) for line in out.splitlines()]
    assert len(results) == 6
    for path, depth, status, body in results:
        assert status == 400, (path, depth, body)
        assert "deeper than 64 levels" in body["error"]["message"], (path, depth, body)
    assert "Traceback" not in (c.root / "main.log").read_text()


def test_a_connection_flood_neither_stops_the_node_nor_stays_open(cluster: Cluster) -> None:
    c = cluster
    main = c.lab.hosts["main"]
    # 20,000 idle and 200 slowloris connections, from two processes (the
    # machine's hard limit on open files may be below 20,200 per process).
    attackers = [
        c.lab.popen(
            "outsider",
            PY,
            str(ROOT / "tests/flood_client.py"),
            main,
            "8000",
            "10000",
            "100",
            str(HEADER_TIMEOUT_S * 15),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        for attacker in attackers:
            assert attacker.stdout is not None and attacker.stderr is not None
            assert attacker.stdout.readline().strip() == "ready", attacker.stderr.read()
        # While the flood is held: a client with a key is answered ...
        answered = chat(c, "client", str(c.key))
        assert answered["status"] == 200, answered
        # ... and the CLI still reaches the node through its admin socket.
        assert json.loads(c.ok("main", "status", "--json"))["running"]
        made = json.loads(c.ok("main", "auth", "key", "create", "after-flood", "--json"))
        assert chat(c, "client", str(made["key"]))["status"] == 200
        reports = [json.loads(a.stdout.readline()) for a in attackers]  # type: ignore[union-attr]
    finally:
        for attacker in attackers:
            attacker.send_signal(signal.SIGTERM)
            attacker.wait(timeout=30)
    # Every slowloris connection was closed by the node, though bytes kept coming
    # (half of them in the body of an inference POST, which no handler reads yet).
    assert sum(r["slow_closed"] for r in reports) == 200, reports
    records = [r for r in c.audit("main") if r["target"] == "after-flood"]
    assert [r["actor"] for r in records] == ["local:root"]  # made by the running node
    log = (c.root / "main.log").read_text()
    assert "gateway: closed" in log and "sent no complete request headers" in log
    assert "from a source already holding 1000" in log
    assert "Traceback" not in log and "Too many open files" not in log
    assert c.procs["main"].poll() is None


def test_exposed_metrics_answer_listed_sources_only(cluster: Cluster) -> None:
    c = cluster
    main, client = c.lab.hosts["main"], c.lab.hosts["client"]
    exposed = {
        "LETSINFER_GATEWAY__METRICS_HOST": "0.0.0.0",
        "LETSINFER_GATEWAY__METRICS_ALLOW": f"{client}/32",
    }
    given_main_with(c, exposed)

    listed = get(c, "client", f"http://{main}:9400/metrics")
    assert listed["status"] == 200 and "letsinfer_gateway_requests" in str(listed["text"])
    assert get(c, "outsider", f"http://{main}:9400/metrics")["status"] is None
    assert get(c, "main", "http://127.0.0.1:9400/metrics")["status"] == 200
    outsider = c.lab.hosts["outsider"]
    log = (c.root / "main.log").read_text()
    assert f"metrics: closed 1 connection(s) from sources not allowed (last: {outsider})" in log
