"""Trust across real links: three nodes in network namespaces, mDNS discovery,
pinned enrollment, mutual TLS, and every refusal a user should see.

The lab and its nodes are shared by the module; each test asks for the state it
needs through a given (``main``, ``child``, ``children``, ``candidates``,
``candidate``, ``second_main``), which makes that state if an earlier test left
another, and counts only the audit records written after it began: any test
runs alone, or in any order."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests import json_docs
from tests.cluster import PY, Cluster
from tests.netlab import NetLab, can_make_namespaces

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")

DENIAL_INTERVAL_S = 5
# Hosts in no letsinfer group that no test ever sets up: the attackers. Each
# attack has its own, so one's refusals never fall in another's count.
FLOODER, PROBER, LISTENER = "flooder", "prober", "listener"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The lab, a main and two candidates (n1, n2), running."""
    lab = NetLab(["main", "n1", "n2", "other", "second", FLOODER, PROBER, LISTENER]).up()
    c = Cluster(lab, tmp_path_factory.mktemp("trust"))
    # Refusals are counted per source and reason over this interval.
    c.extra_env = {
        n: {"LETSINFER_AUDIT__DENIAL_INTERVAL_S": str(DENIAL_INTERVAL_S)} for n in lab.names
    }
    try:
        c.ok("main", "node", "init", "--main", "--name", "main")
        for n in ("n1", "n2"):
            c.ok(n, "node", "init", "--name", n)
        for n in ("main", "n1", "n2"):
            c.up(n)
        yield c
    finally:
        c.stop()
        lab.down()


def identity(c: Cluster, name: str) -> dict[str, object]:
    """What the node with home ``name`` says of itself ({} before its init)."""
    path = c.home(name) / "etc/node.json"
    return json.loads(path.read_text()) if path.exists() else {}


def running(c: Cluster, name: str) -> bool:
    proc = c.procs.get(name)
    return proc is not None and proc.poll() is None


def fresh_node(c: Cluster, name: str, *init: str) -> None:
    """Host ``name``'s node stopped, its home wiped, initialised (``node init
    *init``) and started again: a host that was never set up."""
    proc = c.procs.pop(name, None)
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    shutil.rmtree(c.home(name), ignore_errors=True)
    c.ok(name, "node", "init", *init)
    c.up(name)


def listed_nodes(c: Cluster) -> dict[str, dict[str, object]]:
    return {n["name"]: n for n in json.loads(c.ok("main", "node", "list", "--json"))}


def audit_mark(c: Cluster, node: str) -> int:
    """The sequence number of ``node``'s newest audit record: what a test
    counts from."""
    newest = json.loads(c.ok(node, "audit", "list", "--limit", "1", "--json"))
    return max((int(r["seq"]) for r in newest), default=0)


def audit_since(c: Cluster, node: str, mark: int) -> list[dict[str, object]]:
    return [r for r in c.audit(node) if int(r["seq"]) > mark]  # type: ignore[call-overload]


@pytest.fixture
def main(cluster: Cluster) -> str:
    """The cluster's main, a main of its own cluster: started again from an
    empty home if an earlier test moved it into another cluster."""
    if not (identity(cluster, "main").get("role") == "main" and running(cluster, "main")):
        fresh_node(cluster, "main", "--main", "--name", "main")
    return "main"


def enrolled(c: Cluster, names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` children of the cluster's main, reporting to it. One that is
    not (never enrolled, removed, moved into another cluster) is removed from
    the main's list if it is there, made a candidate again and enrolled."""
    ours = identity(c, "main")["cluster"]
    nodes = listed_nodes(c)
    for n in names:
        me = identity(c, n)
        if (me.get("role"), me.get("cluster")) == ("child", ours) and n in nodes and running(c, n):
            continue  # (reporting, or about to: waited for below)
        if n in nodes:
            c.ok("main", "node", "remove", n)
        if not (me.get("role") == "candidate" and running(c, n)):
            fresh_node(c, n, "--name", n)
        c.enroll(n)

    def reporting() -> bool:
        nodes = listed_nodes(c)
        return all(nodes.get(n, {}).get("state") == "active" for n in names)

    c.wait(reporting, f"{', '.join(names)} reporting to the main")
    return names


@pytest.fixture
def child(cluster: Cluster, main: str) -> str:
    """n1, a child of the cluster's main."""
    return enrolled(cluster, ("n1",))[0]


@pytest.fixture
def children(cluster: Cluster, main: str) -> tuple[str, ...]:
    """n1 and n2, children of the cluster's main."""
    return enrolled(cluster, ("n1", "n2"))


@pytest.fixture
def candidates(cluster: Cluster, main: str) -> tuple[str, ...]:
    """n1 and n2 running as candidates that no main has enrolled, with no
    enrollment request waiting; the main lists neither."""
    c = cluster
    nodes = listed_nodes(c)
    for n in ("n1", "n2"):
        if n in nodes:
            c.ok("main", "node", "remove", n)
        waiting = (
            json.loads(c.ok(n, "node", "requests", "--json"))
            if identity(c, n).get("role") == "candidate" and running(c, n)
            else None
        )
        if waiting == []:
            continue
        fresh_node(c, n, "--name", n)
    return ("n1", "n2")


@pytest.fixture
def candidate(cluster: Cluster) -> str:
    """A candidate nobody has sent anything yet, on host other: made fresh for
    each test (a test fills its requests)."""
    fresh_node(cluster, "other", "--name", "stray")
    return "other"


@pytest.fixture
def second_main(cluster: Cluster) -> str:
    """A main of a cluster of its own, running on host second; its control
    address."""
    c = cluster
    if not running(c, "second"):
        if identity(c, "second").get("role") == "main":
            c.up("second")
        else:
            fresh_node(c, "second", "--main", "--name", "second")
    return f"{c.lab.hosts['second']}:8443"


def pairing_fp(c: Cluster, name: str) -> str:
    from letsinfer.trust import pki

    return pki.fingerprint(pki.load_cert((c.home(name) / "etc/pki/pairing.crt").read_bytes()))


def test_discovery_then_pinned_enrollment_of_two_children(
    cluster: Cluster, candidates: tuple[str, ...]
) -> None:
    c = cluster
    found = {a["name"]: a for a in json.loads(c.ok("main", "node", "add", "--json", "--wait", "3"))}
    assert {"n1", "n2"} <= set(found), found
    assert found["n1"]["fingerprint"] == pairing_fp(c, "n1")
    assert found["n1"]["address"].startswith(c.lab.hosts["n1"])

    for n in candidates:
        out = c.ok("main", "node", "add", n, "--wait", "3")
        request_id = out.split("letsinfer node accept ")[1].split()[0]
        listed = json.loads(c.ok(n, "node", "requests", "--json"))
        json_docs.printed("node requests --json", listed)
        [req] = listed
        assert req["id"] == request_id and req["main"] == "main"
        c.ok(n, "node", "accept", request_id)

    def heard_from_both() -> bool:
        nodes = {x["name"]: x for x in json.loads(c.ok("main", "node", "list", "--json"))}
        return all(
            nodes.get(n, {}).get("state") == "active" and nodes[n]["last_seen"]
            for n in ("n1", "n2")
        )

    c.wait(heard_from_both, "heartbeats over mutual TLS from n1 and n2")
    info = json.loads(c.ok("main", "node", "info", "n1", "--json"))
    assert info["name"] == "n1" and info["role"] == "child"

    status = json.loads(c.ok("n1", "status", "--json"))
    assert status["role"] == "child" and status["main"].startswith(c.lab.hosts["main"])


def counted(c: Cluster, node: str, actor: str, action: str, since: int) -> list[int]:
    """The counts of ``node``'s denial records of one kind written after its
    record ``since`` (one per record)."""
    return [
        int(r["count"] or 1)  # type: ignore[call-overload]
        for r in audit_since(c, node, since)
        if (r["actor"], r["action"], r["outcome"]) == (actor, action, "denied")
    ]


FLOOD = """
import http.client, json, ssl, sys, threading
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
total, tls = int(sys.argv[4]), sys.argv[5] == "tls"
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # an outsider: no CA, no certificate
statuses, lock = {}, threading.Lock()
def worker(n):
    conn = (http.client.HTTPSConnection(host, port, context=ctx, timeout=60) if tls
            else http.client.HTTPConnection(host, port, timeout=60))
    for _ in range(n):  # keep-alive: one connection, many requests
        conn.request("GET", path, headers={"Authorization": "Bearer li-not-a-key"})
        r = conn.getresponse()
        r.read()
        with lock:
            statuses[r.status] = statuses.get(r.status, 0) + 1
    conn.close()
threads = [threading.Thread(target=worker, args=(total // 8,)) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(statuses))
"""


@pytest.mark.usefixtures("main")
def test_floods_without_credentials_add_a_bounded_number_of_records(
    cluster: Cluster, child: str
) -> None:
    """From a host in no letsinfer group: 10,000 requests without a client
    certificate on the control plane and 10,000 with a bad key on
    `GET /v1/models`; on a child, 100 scope denials of the CLI. Each adds a
    few records (the first at once, then one per interval) whose counts add
    up to every refusal."""
    c = cluster
    main, outsider = c.lab.hosts["main"], c.lab.hosts[FLOODER]
    since = {"main": audit_mark(c, "main"), child: audit_mark(c, child)}

    def total(node: str, kind: tuple[str, str]) -> int:
        return sum(counted(c, node, *kind, since=since[node]))

    def flood(port: int, path: str, total: int, tls: bool) -> dict[str, int]:
        done = c.lab.run(
            FLOODER, PY, "-c", FLOOD, main, str(port), path, str(total), "tls" if tls else "plain",
            timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    control = (f"anonymous:{outsider}", "control:request")
    gateway = (f"client:{outsider}", "gateway.request")
    started = time.monotonic()
    assert flood(8443, "/v1/agent/facts", 8, tls=True) == {"403": 8}
    c.wait(lambda: total("main", control) > 0, "the first refusal, written at once")
    assert flood(8443, "/v1/agent/facts", 10_000, tls=True) == {"403": 10_000}
    assert flood(8000, "/v1/models", 10_000, tls=False) == {"401": 10_000}
    elapsed = time.monotonic() - started
    c.wait(
        lambda: (total("main", control), total("main", gateway)) == (10_008, 10_000),
        "every refusal counted once its interval ended",
        timeout=DENIAL_INTERVAL_S * 4,
    )
    # At most the first record, one per interval while the flood lasts, one at its end.
    bound = 2 + math.ceil(elapsed / DENIAL_INTERVAL_S)
    for kind in (control, gateway):
        records = counted(c, "main", *kind, since=since["main"])
        assert len(records) <= bound, (kind, records, elapsed)

    # 100 denied CLI calls on a child: the real CLI once, then 99 in one process
    # (the same code path without 99 interpreter starts).
    cli = ("cli:root", "cli:model list")
    refused = c.cli(child, "model", "list")
    assert refused.returncode == 3
    started = time.monotonic()
    loop = f"""
import click
from letsinfer.cli import cli, main
import letsinfer.cli.model
codes = []
for _ in range(99):
    try:
        cli.main(["--home", "{c.home(child)}", "model", "list"], prog_name="letsinfer",
                 standalone_mode=False)
    except click.ClickException as exc:
        codes.append(exc.exit_code)
print(codes.count(3))
"""
    assert c.py(child, loop).strip() == "99"
    elapsed = time.monotonic() - started
    c.wait(
        lambda: total(child, cli) == 100,
        "every scope denial counted",
        timeout=DENIAL_INTERVAL_S * 4,
    )
    records = counted(c, child, *cli, since=since[child])
    assert len(records) <= 2 + math.ceil(elapsed / DENIAL_INTERVAL_S)
    c.ok("main", "audit", "verify")
    c.ok(child, "audit", "verify")


def test_refusals_are_clear_and_audited(
    cluster: Cluster, children: tuple[str, ...], candidate: str
) -> None:
    c = cluster
    main_addr = c.lab.hosts["main"]
    since = {n: audit_mark(c, n) for n in ("main", *children)}

    def audited(node: str) -> list[dict[str, object]]:
        return audit_since(c, node, since[node])

    # A child running a main-scope command is told where the main is.
    refused = c.cli("n1", "model", "list")
    assert refused.returncode == 3 and f"{main_addr}:8443" in refused.stderr

    # A wrong pin: refused before anything is sent (to a candidate on other).
    assert candidate == "other"
    before = c.ok("other", "node", "requests", "--json")
    wrong = c.cli(
        "main",
        "node",
        "add",
        "--address",
        f"{c.lab.hosts['other']}:8444",
        "--fingerprint",
        "0" * 64,
    )
    assert wrong.returncode == 1 and "refused before anything was sent" in wrong.stderr
    assert c.ok("other", "node", "requests", "--json") == before == "[]\n"
    assert any(
        (r["actor"], r["action"], r["outcome"])
        == (f"peer:{c.lab.hosts['other']}:8444", "node.add", "denied")
        and "pinned fingerprint" in str(r["detail"])
        for r in audited("main")
    ), "the main audits the pin mismatch"

    # A second main never adopts an enrolled node silently.
    n1_before = json.loads(c.ok("n1", "status", "--json"))
    second = c.root / "adopter"  # a second main's home, on the "other" host
    c.ok("other", "node", "init", "--main", "--name", "second", home="adopter")
    adopt = c.cli(
        "other",
        "node",
        "add",
        "--address",
        f"{c.lab.hosts['n1']}:8444",
        "--fingerprint",
        n1_before["fingerprint"],
        home="adopter",
    )
    assert adopt.returncode == 1 and "already belongs to a cluster" in adopt.stderr
    assert "move-into" in adopt.stderr
    c.wait(
        lambda: any(
            r["action"] == "node.enroll.request" and r["outcome"] == "denied" for r in audited("n1")
        ),
        "n1 auditing the refused adoption",
    )
    n1_after = json.loads(c.ok("n1", "status", "--json"))
    assert (n1_after["role"], n1_after["main"]) == ("child", n1_before["main"])
    assert n1_after["fingerprint"] == n1_before["fingerprint"]

    # move-into is refused while the node has an active placement group or children.
    moving = c.cli("main", "node", "move-into", "--main", f"{c.lab.hosts['other']}:8443")
    assert moving.returncode == 1 and "active placement groups" in moving.stderr
    assert "attached children: n1, n2" in moving.stderr
    assert not (c.home("main") / "var/move-into.json").exists()
    assert any(
        r["action"] == "node.move-into" and r["outcome"] == "denied" for r in audited("main")
    )

    # A certificate from another CA cannot even complete the TLS handshake, and
    # the main audits the refused handshake with the address it came from.
    probe = c.lab.run(
        "other",
        PY,
        "-c",
        f"""
import ssl, httpx
from letsinfer.trust.peer import client_context
from pathlib import Path
d = next(Path("{second}/etc/clusters").glob("*"))
ctx = client_context(d / "ca.crt", d / "node.crt", Path("{second}/etc/pki/node.key"))
ctx.verify_mode = ssl.CERT_NONE
try:
    httpx.post("https://{main_addr}:8443/v1/agent/heartbeat", json={{"version": "x"}},
               verify=ctx, timeout=5)
    print("ACCEPTED")
except (httpx.HTTPError, ssl.SSLError) as exc:
    print("REFUSED", type(exc).__name__)
""",
    )
    assert "REFUSED" in probe.stdout, probe.stdout + probe.stderr
    c.wait(
        lambda: any(
            r["actor"] == f"tls:{c.lab.hosts['other']}"
            and r["action"] == "control:handshake"
            and r["outcome"] == "denied"
            and "CA" in str(r["detail"])
            for r in audited("main")
        ),
        "the main audits the handshake refused over another CA's certificate",
    )

    # A removed node's certificate is refused from then on, and that is audited.
    c.ok("main", "node", "remove", "n2")
    c.wait(
        lambda: any(
            r["outcome"] == "denied"
            and str(r["actor"]).startswith("node:")
            and "revoked" in str(r["detail"])
            for r in audited("main")
        ),
        "the main refusing n2's heartbeat",
    )
    assert "n2" not in c.ok("main", "node", "list", "--json")

    # The main tells its children what it revoked: n1's agent now refuses n2's
    # certificate too (a link challenge is the one route members may call).
    probe_n1 = f"""
import httpx
from letsinfer.home import Home
from letsinfer.identity import load_identity
from letsinfer.trust.material import tls_files
from letsinfer.trust.peer import client_context
home = Home.resolve("{c.home("n2")}")
f = tls_files(home, load_identity(home.identity_file))
r = httpx.post("https://{c.lab.hosts["n1"]}:8444/v1/link/challenge", json={{}},
               verify=client_context(f.ca, f.cert, f.key), timeout=5)
print(r.status_code, r.text)
"""
    c.wait(lambda: c.py("n2", probe_n1).startswith("403"), "n1 refusing n2's certificate")
    assert "revoked" in c.py("n2", probe_n1)
    c.wait(
        lambda: any(
            r["outcome"] == "denied" and "revoked" in str(r["detail"]) for r in audited("n1")
        ),
        "n1 auditing the refusal",
    )

    # Removed, n2 was told so (it stopped its engines), and its main no longer
    # answers for it: the agent's live state (no engine) decides a move, which
    # says that the main could not be asked.
    assert ("node.removed", "ok") in [(r["action"], r["outcome"]) for r in audited("n2")]
    moved = c.ok("n2", "node", "move-into", "--main", f"{c.lab.hosts['other']}:8443")
    assert "the main could not be asked" in moved and "removed from the cluster" in moved
    assert "its agent runs no engine" in moved
    [allowed] = [r for r in audited("n2") if r["action"] == "node.move-into"]
    assert allowed["outcome"] == "ok" and "could not be asked" in str(allowed["detail"])


# An outsider's attempts to make a node hold what it sends: bodies, headers,
# a body that never ends, and enrollment requests a candidate would keep.
EXHAUST = """
import json, socket, ssl, sys, time
from cryptography.hazmat.primitives.asymmetric import ec
main, candidate, candidate_id = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # no CA, no certificate
out = {}

def connect(host, port, tls):
    s = socket.create_connection((host, port), timeout=30)
    return ctx.wrap_socket(s, server_hostname=host) if tls else s

def answer(s):
    data = b""
    s.settimeout(60)
    try:
        while chunk := s.recv(65536):
            data += chunk
    except OSError:
        pass
    return data

def status(data):
    return data.split(b"\\r\\n", 1)[0].decode(errors="replace")

def post(path, extra=b""):
    return (f"POST {path} HTTP/1.1\\r\\nHost: x\\r\\ncontent-type: application/json\\r\\n"
            ).encode() + extra

# 1. A body declared larger than any a node takes: refused unread.
s = connect(main, 8443, True)
s.sendall(post("/v1/pair/controller", b"content-length: 4194304\\r\\n\\r\\n"))
out["declared"] = status(answer(s))
s.close()

# 2. The same, chunked: how much does the node take before it stops reading?
s = connect(main, 8443, True)
s.sendall(post("/v1/pair/controller", b"transfer-encoding: chunked\\r\\n\\r\\n"))
sent, piece = 0, b"10000\\r\\n" + b"A" * 0x10000 + b"\\r\\n"
try:
    while sent < 64 << 20:
        s.sendall(piece)
        sent += 0x10000
except OSError:
    pass
out["chunked"] = {"sent": sent, "status": status(answer(s))}
s.close()

# 3. A wrong body: told what is wrong, never sent its own bytes back.
s = connect(main, 8443, True)
body = json.dumps({"pad": "A" * 50000}).encode()
s.sendall(post("/v1/enroll/complete", b"content-length: %d\\r\\n\\r\\n" % len(body)) + body)
data = answer(s)
out["invalid"] = {"status": status(data), "size": len(data), "echo": b"AAAA" in data}
s.close()

# 4. A body that trickles, a byte a second, never ending.
s = connect(main, 8443, True)
s.sendall(post("/v1/pair/controller", b"content-length: 1000\\r\\n\\r\\n{"))
started, data = time.monotonic(), b""
s.settimeout(1.0)
while time.monotonic() - started < 60:
    try:
        chunk = s.recv(65536)
    except TimeoutError:
        try:
            s.sendall(b" ")
        except OSError:
            break
        continue
    except OSError:
        break
    if not chunk:
        break
    data += chunk
out["trickle"] = {"status": status(data), "after_s": time.monotonic() - started}
s.close()

# 5. Headers that never end, on the gateway.
s = connect(main, 8000, False)
sent = 0
try:
    s.sendall(b"GET /health HTTP/1.1\\r\\nHost: x\\r\\nX-Big: ")
    while sent < 4 << 20:
        s.sendall(b"a" * 16384)
        sent += 16384
except OSError:
    pass
out["headers"] = {"sent": sent, "status": status(answer(s))}
s.close()

# 6. Enrollment requests at a candidate, each kept for decades if it could:
# from a cluster of its own (its own CA and main key, as letsinfer makes them),
# so each proves its main's key; and one that proves nothing.
from letsinfer.trust import pki, request_proof
ca_key, ca_cert = pki.create_ca("a cluster of my own")
ca = pki.cert_pem(ca_cert).decode()
main_key = ec.generate_private_key(ec.SECP256R1())
main_cert = pki.cert_pem(pki.issue(ca_key, ca_cert, main_key.public_key(), kind="node",
                                   subject_id="m0", role="main", days=30)).decode()
statuses = []
for i in range(41):
    request = {"enrollment_id": f"enr-flood{i:04d}", "main_id": "m0", "main_name": "x" * 200,
               "main_address": "192.0.2.9:8443", "ca": ca, "token": "t" * 43,
               "expires_at": time.time() + 30 * 365 * 86400, "gateway_url": None}
    if i < 38:
        fields = {k: v for k, v in request.items() if k != "ca"}
        fields["ca_pem"] = ca
        signed = request_proof.message(candidate_id=candidate_id, **fields)
        request["main_cert"] = main_cert
        request["signature"] = request_proof.sign(main_key, signed)
    if i == 38:
        request["expires_at"] = float("nan")  # never expires, never shown
    if i == 39:
        request["main_name"] = "x" * 100000  # no field takes that much
    if i == 40:
        request["enrollment_id"] = "enr-unproven"  # signed by no one: refused
    body = json.dumps(request).encode()
    s = connect(candidate, 8444, True)
    head = b"content-length: %d\\r\\nconnection: close\\r\\n\\r\\n" % len(body)
    s.sendall(post("/v1/enroll/request", head) + body)
    statuses.append(status(answer(s)))
    s.close()
out["enroll"] = statuses
print(json.dumps(out))
"""


def resident_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:", 1)[1].split()[0])


@pytest.mark.usefixtures("main")
def test_an_outsider_cannot_make_a_node_hold_what_it_sends(
    cluster: Cluster, candidate: str
) -> None:
    """From a host in no letsinfer group (never set up):
    the open paths of the mutual-TLS planes read at most 1 MiB of a body and
    wait at most 10 s for it; the gateway holds at most 128 KiB of headers; a
    refusal never echoes the body; a candidate keeps at most 32 requests, for
    at most a week, and a flood of them costs its audit chain a few records."""
    c = cluster
    main, candidate_addr = c.lab.hosts["main"], c.lab.hosts[candidate]
    since = audit_mark(c, candidate)
    rss, peak, stop = resident_kib(c.procs["main"].pid), [0], threading.Event()

    def watch() -> None:  # the main's memory while the outsider sends
        while not stop.is_set():
            peak[0] = max(peak[0], resident_kib(c.procs["main"].pid))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        candidate_id = json.loads(c.ok(candidate, "status", "--json"))["node_id"]
        done = c.lab.run(PROBER, PY, "-c", EXHAUST, main, candidate_addr, candidate_id, timeout=600)
    finally:
        stop.set()
        watcher.join()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    # 64 MiB of body and 4 MiB of headers sent; the main held next to none of it.
    assert peak[0] - rss < 32 * 1024, (rss, peak)

    assert seen["declared"].startswith("HTTP/1.1 413"), seen
    chunked = seen["chunked"]
    assert chunked["status"] in ("", "HTTP/1.1 413 Request Entity Too Large"), chunked
    assert seen["invalid"]["status"].startswith("HTTP/1.1 422"), seen
    assert not seen["invalid"]["echo"] and seen["invalid"]["size"] < 4096, seen
    assert seen["trickle"]["status"].startswith("HTTP/1.1 408"), seen
    assert seen["trickle"]["after_s"] < 30, seen
    headers = seen["headers"]
    assert headers["sent"] < 4 << 20 or headers["status"].startswith("HTTP/1.1 431"), headers
    assert headers["status"] in ("", "HTTP/1.1 431 Request Header Fields Too Large"), headers

    enroll = seen["enroll"]
    assert all(x.startswith("HTTP/1.1 200") for x in enroll[:38]), enroll
    assert enroll[38].startswith("HTTP/1.1 422") and enroll[39].startswith("HTTP/1.1 422"), enroll
    assert enroll[40].startswith("HTTP/1.1 403"), enroll  # proves no main's key
    pending = json.loads(c.ok(candidate, "node", "requests", "--json"))
    flood = [r for r in pending if r["id"].startswith("enr-flood")]
    assert len(pending) <= 32 and len(flood) == len(pending)
    assert {r["id"] for r in flood} == {f"enr-flood{i:04d}" for i in range(38 - len(flood), 38)}
    week = time.time() + 7 * 86400 + 60
    assert all(datetime.fromisoformat(r["expires"]).timestamp() < week for r in flood)
    records = [r for r in audit_since(c, candidate, since) if r["action"] == "node.enroll.request"]
    # one each while there is room, then counted (and the unproven one refused)
    assert len(records) <= 32 + 4, records
    c.wait(
        lambda: sum(counted(c, candidate, f"anonymous:{c.lab.hosts[PROBER]}",
                            "node.enroll.request", since)) == 38 - 32 + 1,
        "the requests past the room counted as a flood, and the unproven one",
        timeout=DENIAL_INTERVAL_S * 4,
    )  # fmt: skip
    assert json.loads(c.ok("main", "status", "--json"))["state"] in ("running", "active")


@pytest.mark.usefixtures("main")
def test_controller_roles(cluster: Cluster, child: str) -> None:
    c = cluster
    main_control = f"{c.lab.hosts['main']}:8443"
    since = audit_mark(c, "main")

    def pair(role: str, home: str) -> None:
        out = c.ok("main", "auth", "controller", "add", "--role", role, "--name", home)
        code = out.split("code: ")[1].split()[0]
        comparison = out.split("comparison: ")[1].split()[0]
        bad = c.cli(
            "other",
            "controller",
            "pair",
            "--main",
            main_control,
            "--code",
            code,
            "--expect",
            "aaaa-bbbb-cccc",
            home=home,
        )
        assert bad.returncode == 1 and "comparison strings differ" in bad.stderr
        assert not (c.home(home) / "etc/controller/controller.crt").exists()
        out = c.ok(
            "other",
            "controller",
            "pair",
            "--main",
            main_control,
            "--code",
            code,
            "--expect",
            comparison,
            home=home,
        )
        assert role in out
        key_pem = (c.home(home) / "etc/controller/controller.key").read_text()
        assert key_pem.split("\n")[1] not in out, "the key is never printed"
        reuse = c.cli(
            "other",
            "controller",
            "pair",
            "--main",
            main_control,
            "--code",
            code,
            "--yes",
            home=f"{home}-again",
        )
        assert reuse.returncode == 1 and "already used" in reuse.stderr

    pair("viewer", "ctl-viewer")
    pair("operator", "ctl-operator")

    state = json.loads(c.ok("other", "controller", "state", "--json", home="ctl-viewer"))
    assert {n["name"] for n in state["nodes"]} >= {"main", child}

    denied = c.cli("other", "controller", "model", "stop", "tiny", home="ctl-viewer")
    assert denied.returncode == 1 and "needs the operator role" in denied.stderr

    c.ok("other", "controller", "model", "stop", "tiny", home="ctl-operator")
    c.ok("other", "controller", "model", "start", "tiny", home="ctl-operator")
    key = c.cli("other", "controller", "key", "create", "k1", home="ctl-operator")
    assert key.returncode == 1 and "needs the administrator role" in key.stderr

    records = audit_since(c, "main", since)
    denials = [
        r for r in records if r["outcome"] == "denied" and str(r["actor"]).startswith("controller:")
    ]
    assert {str(r["action"]) for r in denials} >= {"/v1/ops/models/tiny/stop", "/v1/ops/keys"}
    assert any(
        r["action"] == "model.stop" and r["actor"] == "controller:ctl-operator" for r in records
    )

    c.ok("main", "auth", "controller", "revoke", "ctl-viewer")
    gone = c.cli("other", "controller", "state", home="ctl-viewer")
    assert gone.returncode == 1 and "revoked" in gone.stderr
    assert c.ok("main", "audit", "verify")


_MDNS_LISTENER = """
import socket, struct, time, json
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("", 5353))
s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
             struct.pack("4s4s", socket.inet_aton("224.0.0.251"), socket.inet_aton("0.0.0.0")))
s.settimeout(0.5)
from zeroconf import DNSOutgoing, DNSQuestion
from zeroconf.const import _CLASS_IN, _FLAGS_QR_QUERY, _TYPE_PTR, _TYPE_ANY
# Ask as a plain multicast query (QM), so every answer goes to the group.
query = DNSOutgoing(_FLAGS_QR_QUERY)
query.add_question(DNSQuestion("_letsinfer._tcp.local.", _TYPE_PTR, _CLASS_IN))
packets, end, asked = [], time.time() + 5, 0
while time.time() < end:
    if asked < 3 and time.time() > end - 5 + asked * 1.2:
        s.sendto(query.packets()[0], ("224.0.0.251", 5353))
        asked += 1
    try:
        packets.append(s.recv(9000).hex())
    except socket.timeout:
        pass
print(json.dumps(packets))
"""


def mdns_packets(c: Cluster) -> list[bytes]:
    """What a host in no letsinfer group hears on the wire, asking as anyone may."""
    listener = c.lab.run(LISTENER, PY, "-c", _MDNS_LISTENER, timeout=60)
    return [bytes.fromhex(p) for p in json.loads(listener.stdout)]


def txt_records(packets: list[bytes]) -> list[dict[str, str]]:
    from zeroconf import DNSIncoming, DNSText

    records = []
    for raw in packets:
        for answer in DNSIncoming(raw).answers():
            if not isinstance(answer, DNSText):
                continue
            text, fields, i = answer.text, {}, 0
            while i < len(text):
                n = text[i]
                key, _, value = text[i + 1 : i + 1 + n].partition(b"=")
                fields[key.decode()] = value.decode()
                i += 1 + n
            records.append(fields)
    return records


@pytest.mark.usefixtures("main")
def test_mdns_records_carry_no_secret_model_or_telemetry(cluster: Cluster) -> None:
    c = cluster
    packets = mdns_packets(c)
    txts = txt_records(packets)
    assert txts, "no TXT records were seen on the wire"
    keys = {key for txt in txts for key in txt}
    assert keys <= {"id", "fp", "role", "pairing", "gateway"}, keys
    wire = b"".join(packets)
    for forbidden in (b"li-", b"tiny", b"BEGIN", b"token", b"key=", b"models"):
        assert forbidden not in wire, forbidden
    assert b"role=main" in wire and b"gateway=http://" in wire, wire


def said_fingerprint(c: Cluster, host: str) -> str:
    """The fingerprint a node's agent plane gives on its open /v1/identity."""
    script = (
        "import json, ssl, urllib.request\n"
        "ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)\n"
        "ctx.check_hostname = False\n"
        "ctx.verify_mode = ssl.CERT_NONE\n"
        f"url = 'https://{c.lab.hosts[host]}:8444/v1/identity'\n"
        "print(json.load(urllib.request.urlopen(url, context=ctx, timeout=5))['fingerprint'])\n"
    )
    return c.py("n2", script).strip()


def presented(c: Cluster, host: str, port: int) -> str:
    """The fingerprint of the certificate a plane presents, seen from n2."""
    script = (
        "import hashlib, socket, ssl\n"
        "ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)\n"
        "ctx.check_hostname = False\n"
        "ctx.verify_mode = ssl.CERT_NONE\n"
        f"with socket.create_connection(({c.lab.hosts[host]!r}, {port}), timeout=5) as raw:\n"
        "    with ctx.wrap_socket(raw) as tls:\n"
        "        print(hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest())\n"
    )
    return c.py("n2", script).strip()


@pytest.mark.usefixtures("child")  # n1
def test_certificates_are_renewed_and_presented_without_a_restart(cluster: Cluster) -> None:
    """Node certificates last 30 days. A child renews its own through the main,
    the main issues its own with its CA, and every running plane and client
    presents the new one at once: a cluster outlives its certificates with no
    restart. Here every certificate counts as due (renewed 31 days before it
    expires), so each node renews every few seconds."""
    c = cluster
    from letsinfer.trust import pki

    due = {"LETSINFER_CONTROL__RENEW_CERTIFICATES_BEFORE_S": str(31 * 86400)}
    # A child renews with its heartbeat: every 3 s here, so that what its plane
    # presents, the authority records and its disk holds can be read between two.
    beat = {"main": {}, "n1": {"LETSINFER_CONTROL__HEARTBEAT_INTERVAL_S": "3"}}
    saved = {n: dict(c.extra_env.get(n, {})) for n in ("main", "n1")}
    since = audit_mark(c, "main")

    def renewals(target: str) -> int:
        return sum(
            r["action"] == "node.certificate.renew" and r["target"] == target
            for r in audit_since(c, "main", since)
        )

    def recorded(name: str) -> str:
        nodes = json.loads(c.ok("main", "node", "list", "--json"))
        return str(next(n["fingerprint"] for n in nodes if n["name"] == name))

    def on_disk(name: str) -> str:
        [cert] = (c.home(name) / "etc/clusters").glob("*/node.crt")
        return pki.fingerprint(pki.load_cert(cert.read_bytes()))

    before = {n: on_disk(n) for n in ("main", "n1")}
    try:
        for n in ("main", "n1"):
            c.extra_env[n] = {**saved[n], **due, **beat[n]}
            c.restart(n)
        c.wait(
            lambda: renewals("main") >= 2 and renewals("n1") >= 2,
            "the main and n1 renewing their certificates",
            timeout=90,
        )
        # What each running plane presents is what the authority records and
        # the node has on disk (read in a loop: they renew every few seconds).
        for name, port in (("main", 8443), ("n1", 8444)):
            c.wait(
                lambda name=name, port=port: (  # type: ignore[misc]
                    presented(c, name, port) == recorded(name) == on_disk(name)
                ),
                f"{name}'s plane presenting its renewed certificate",
            )
            assert on_disk(name) != before[name]
        # What each node says of itself follows too: its agent plane's
        # /v1/identity and its mDNS record, as a host in no group sees them.
        for name in ("main", "n1"):
            c.wait(
                lambda name=name: said_fingerprint(c, name) == on_disk(name),  # type: ignore[misc]
                f"{name}'s /v1/identity naming its renewed certificate",
            )
        node_ids = {
            name: json.loads((c.home(name) / "etc/node.json").read_text())["node_id"]
            for name in ("main", "n1")
        }

        def advertised_current() -> bool:
            current = {name: {on_disk(name)} for name in node_ids}
            heard = txt_records(mdns_packets(c))
            for name in node_ids:  # a renewal while listening: either is current
                current[name].add(on_disk(name))
            return all(
                {t.get("fp") for t in heard if t.get("id") == node_id} & current[name]
                for name, node_id in node_ids.items()
            )

        c.wait(advertised_current, "mDNS records naming the renewed certificates", timeout=60)
        # n1 goes on reporting with its renewed client certificate, and the
        # chain of every renewal verifies.
        c.wait(
            lambda: any(
                n["name"] == "n1" and n["state"] == "active"
                for n in json.loads(c.ok("main", "node", "list", "--json"))
            ),
            "n1 reporting",
        )
        assert c.cli("main", "audit", "verify").returncode == 0
    finally:
        for n in ("main", "n1"):
            c.extra_env[n] = saved[n]
            c.restart(n)


@pytest.mark.usefixtures("child")  # n1
def test_moving_a_child_is_explicit_and_atomic(cluster: Cluster, second_main: str) -> None:
    c = cluster
    from letsinfer.trust import pki

    second = second_main
    n1_cert = next((c.home("n1") / "etc/clusters").glob("*/node.crt"))
    fp = pki.fingerprint(pki.load_cert(n1_cert.read_bytes()))
    before = json.loads((c.home("n1") / "etc/node.json").read_text())
    models_before = sorted(
        p.name for p in (c.home("n1") / "var").rglob("*") if p.is_file() and "models" in p.parts
    )

    def offer() -> str:
        out = c.ok(
            "second",
            "node",
            "add",
            "--address",
            f"{c.lab.hosts['n1']}:8444",
            "--fingerprint",
            fp,
            home="second",
        )
        return out.split("letsinfer node accept ")[1].split()[0]

    c.ok("n1", "node", "move-into", "--main", second)
    request_id = offer()

    # Interrupted: the new main is gone when the node accepts. Nothing moves.
    proc = c.procs.pop("second")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    failed = c.cli("n1", "node", "accept", request_id)
    assert failed.returncode == 1 and "cannot reach the main" in failed.stderr
    assert json.loads((c.home("n1") / "etc/node.json").read_text()) == before
    assert n1_cert.exists()
    c.wait(
        lambda: (
            next(
                n for n in json.loads(c.ok("main", "node", "list", "--json")) if n["name"] == "n1"
            )["state"]
            == "active"
        ),
        "n1 still in its cluster",
    )

    # Completed: a new request, accepted; certificates and authority replaced,
    # model data kept.
    c.up("second")
    c.ok("n1", "node", "accept", offer())
    after = json.loads((c.home("n1") / "etc/node.json").read_text())
    assert after["main_address"] == second and after["cluster"] != before["cluster"]
    assert after["node_id"] == before["node_id"]
    assert not n1_cert.exists(), "the old cluster's certificate is gone"
    models_after = sorted(
        p.name for p in (c.home("n1") / "var").rglob("*") if p.is_file() and "models" in p.parts
    )
    assert models_after == models_before
    c.wait(
        lambda: any(
            n["name"] == "n1" and n["state"] == "active"
            for n in json.loads(c.ok("second", "node", "list", "--json", home="second"))
        ),
        "n1 reporting to its new main",
    )


def test_a_main_without_work_moves_into_another_cluster_and_serves(
    cluster: Cluster, children: tuple[str, ...], second_main: str
) -> None:
    c = cluster
    from letsinfer.trust import pki

    second = second_main
    # Its own model stopped, the main still has children: refused, nothing changed.
    c.ok("main", "model", "stop", "tiny")
    refused = c.cli("main", "node", "move-into", "--main", second)
    assert refused.returncode == 1 and "attached children: n1, n2" in refused.stderr
    assert "active placement groups" not in refused.stderr
    assert not (c.home("main") / "var/move-into.json").exists()
    for n in children:
        c.ok("main", "node", "remove", n)

    def models() -> list[str]:
        return sorted(p.name for p in (c.home("main") / "var/models").rglob("*") if p.is_file())

    models_before = models()
    assert models_before
    c.ok("main", "node", "move-into", "--main", second)
    [main_cert] = (c.home("main") / "etc/clusters").glob("*/node.crt")
    offer = c.ok(
        "second",
        *("node", "add", "--address", f"{c.lab.hosts['main']}:8444"),
        *("--fingerprint", pki.fingerprint(pki.load_cert(main_cert.read_bytes()))),
        home="second",
    )
    request_id = offer.split("letsinfer node accept ")[1].split()[0]
    [req] = json.loads(c.ok("main", "node", "requests", "--json"))
    assert req["id"] == request_id and req["main"] == "second"
    out = c.ok("main", "node", "accept", request_id)
    assert "now a child of second" in out and "retired" in out, out

    # One step: it is a child of `second`; its old authority is kept aside, its
    # CA and release keys are gone, its models stay.
    after = json.loads((c.home("main") / "etc/node.json").read_text())
    assert (after["role"], after["main_address"]) == ("child", second)
    assert not (c.home("main") / "etc/ca").exists()
    assert not (c.home("main") / "etc/release").exists()
    [kept] = (c.home("main") / "var/retired").iterdir()
    assert (kept / "authority.db").exists() and (kept / "ca.crt").exists()
    assert models() == models_before
    scoped = c.cli("main", "node", "list")
    assert scoped.returncode == 3 and f"child of the main at {second}" in scoped.stderr

    def joined() -> bool:
        nodes = json.loads(c.ok("second", "node", "list", "--json", home="second"))
        return any(n["name"] == "main" and n["state"] == "active" for n in nodes)

    c.wait(joined, "the former main reporting to second")
    c.ok(
        "second",
        *("model", "install", "tiny", "--node", "main", "--target", "cpu", "--yes"),
        home="second",
    )
    key = c.ok("second", "auth", "key", "create", "moved", home="second").split()[-1]

    def served() -> bool:
        result = c.lab.run(
            "second",
            PY,
            str(ROOT / "tests/load_client.py"),
            *(f"http://{c.lab.hosts['second']}:8000", key, "tiny", "4", "1"),
        )
        return json.loads(result.stdout or "[]") == [200] * 4

    def moved_serves() -> bool:
        shown = json.loads(c.ok("second", "model", "show", "tiny", "--json", home="second"))
        states = {g["node"]: (g["state"], g["detail"]) for g in shown["placement_groups"]}
        return states.get("main", ("",))[0] == "ready"

    c.wait(moved_serves, "the former main's group ready", timeout=60)
    c.wait(served, "tiny served through second's gateway")
