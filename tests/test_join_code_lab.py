"""Join codes between hosts: `node add --code` on the main, `letsinfer join`
on a candidate; a used, an expired and a guessed code refused, a fake main
never told anything of the code. The attacker and the fake main act from a
lab host in no letsinfer group."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import PY, Cluster
from tests.netlab import NetLab, can_make_namespaces

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")

FAKE_MAIN = """
import http.server, json, pathlib, ssl, sys
from letsinfer.trust import pki

host, port, log_path, shown_ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ca_key, ca = pki.create_ca("m-fake")
key = pki.new_key()
cert = pki.issue(ca_key, ca, key.public_key(), kind="node", subject_id="m-fake", role="main",
                 days=1)
d = pathlib.Path(log_path).parent / f"fake-main-{port}"  # the test's own folder
d.mkdir()
pki.write_pem(d / "c.pem", pki.cert_pem(cert))
pki.write_private_key(d / "k.pem", key)
# its own CA, or (as an attacker could) a copy of the real main's, which is public
shown = pki.cert_pem(ca).decode() if shown_ca == "-" else pathlib.Path(shown_ca).read_text()

class Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps its connections, as a real main does

    def note(self, body):
        with open(log_path, "a") as f:
            f.write(json.dumps({"method": self.command, "path": self.path, "body": body}) + "\\n")

    def do_GET(self):
        self.note("")
        data = json.dumps({"ca": shown, "main_id": "m-fake", "nonce": "1.a.b"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self.note(self.rfile.read(int(self.headers.get("content-length") or 0)).decode())
        self.send_response(500)
        self.send_header("content-length", "0")
        self.end_headers()

srv = http.server.ThreadingHTTPServer((host, port), Answer)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(d / "c.pem", d / "k.pem")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print("ready", flush=True)
srv.serve_forever()
"""

GUESSES = """
import os, sys, tempfile
from dataclasses import replace
from pathlib import Path
from letsinfer.authority.bootstrap import init_candidate
from letsinfer.home import Home
from letsinfer.trust import join
from letsinfer.trust.candidate import EnrollmentError
from letsinfer.trust.join_code import JoinCode

address, text = sys.argv[1], sys.argv[2]
known = JoinCode.parse(text)  # the id and the CA are no secret: the guess is the secret
homes = tempfile.TemporaryDirectory(prefix="letsinfer-guesses-")
for i in range(20):
    guess = replace(known, secret=os.urandom(len(known.secret)))
    home = Home.under(Path(homes.name) / f"guess{i}")
    ident = init_candidate(home, name=f"guess{i}")
    checked = join.check_main(address, guess)
    try:
        join.enroll(home, ident, address, guess, checked, "10.0.0.250:8444")
        print("ENROLLED")
    except EnrollmentError as exc:
        print(exc)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    lab = NetLab(["main", "n1", "n2", "outsider"]).up()
    c = Cluster(lab, tmp_path_factory.mktemp("join"))
    try:
        c.ok("main", "node", "init", "--main", "--name", "main")
        c.up("main")
        yield c
    finally:
        c.stop()
        lab.down()


def new_code(c: Cluster, ttl: str = "15m") -> str:
    return json.loads(c.ok("main", "node", "add", "--code", "--ttl", ttl, "--json"))["code"]


def main_at(c: Cluster) -> str:
    return f"{c.lab.hosts['main']}:8443"


def children(c: Cluster) -> dict[str, str]:
    nodes = json.loads(c.ok("main", "node", "list", "--json"))
    return {n["name"]: n["state"] for n in nodes if n["role"] == "child"}


def audited(c: Cluster, name: str, action: str, home: str | None = None) -> list[dict[str, object]]:
    rows = json.loads(c.ok(name, "audit", "list", "--json", home=home))
    return [r for r in rows if r["action"] == action]


def main_refused(c: Cluster, reason: str) -> bool:
    return any(
        r["outcome"] == "denied" and r["detail"] == reason for r in audited(c, "main", "node.join")
    )


def test_a_join_code_enrolls_a_running_candidate_once(cluster: Cluster) -> None:
    c = cluster
    code = new_code(c)
    c.ok("n1", "node", "init", "--name", "n1")
    c.up("n1")
    out = c.ok("n1", "join", main_at(c), code)
    assert "is now a child of the main" in out
    c.wait(lambda: children(c).get("n1") == "active", "n1 active")
    assert json.loads(c.ok("n1", "status", "--json"))["role"] == "child"
    # (the module's other tests make codes of their own)
    made = [
        r
        for r in audited(c, "main", "node.join.code")
        if r["outcome"] == "ok" and r["target"] == code.split("-")[1]
    ]
    assert len(made) == 1, made
    assert any(
        r["outcome"] == "ok" and r["target"] == "n1" for r in audited(c, "main", "node.join")
    )

    # it serves as a child: a placement on it becomes ready
    c.ok("main", "model", "install", "tiny", "--node", "n1", "--target", "cpu", "--yes")

    def ready_on_n1() -> bool:
        shown = json.loads(c.ok("main", "model", "show", "tiny", "--json"))
        return any(g["node"] == "n1" and g["state"] == "ready" for g in shown["placement_groups"])

    c.wait(ready_on_n1, "a group of tiny ready on n1", timeout=90)

    # the same code again, from a fresh home on another host
    again = c.cli("n2", "join", main_at(c), code, "--name", "again", home="n2-again")
    assert again.returncode == 1 and "has been used already" in again.stderr
    assert "again" not in children(c)
    c.wait(lambda: main_refused(c, "join: code used already"), "the reuse audited")


def test_an_expired_code_is_refused(cluster: Cluster) -> None:
    c = cluster
    code = new_code(c, ttl="1s")
    time.sleep(1.5)
    late = c.cli("n2", "join", main_at(c), code, "--name", "late", home="n2-late")
    assert late.returncode == 1 and "expired" in late.stderr
    assert "late" not in children(c)
    c.wait(lambda: main_refused(c, "join: code expired"), "the expired code audited")


def test_a_fake_main_is_never_told_the_code(cluster: Cluster, tmp_path: Path) -> None:
    """A host at the address the candidate was given, with a CA of its own, or
    showing the real main's (public) CA with a certificate it cannot have."""
    c = cluster
    code = new_code(c)
    secret = code.rsplit("-", 1)[1]
    log = tmp_path / "fake.log"
    real_ca = tmp_path / "real-ca.pem"
    real_ca.write_text(next((c.home("main") / "etc").glob("clusters/*/ca.crt")).read_text())
    fakes = [
        c.lab.popen(
            "outsider",
            PY,
            "-c",
            FAKE_MAIN,
            c.lab.hosts["outsider"],
            port,
            str(log),
            shown,
            stdout=subprocess.PIPE,
        )
        for port, shown in (("8443", "-"), ("9443", str(real_ca)))
    ]
    try:
        for fake in fakes:
            assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
        c.ok("n2", "node", "init", "--name", "n2fake", home="n2-fake")
        own = c.cli("n2", "join", f"{c.lab.hosts['outsider']}:8443", code, home="n2-fake")
        assert own.returncode == 1 and "not the one in the join code" in own.stderr
        copied = c.cli("n2", "join", f"{c.lab.hosts['outsider']}:9443", code, home="n2-fake")
        assert copied.returncode == 1, copied.stdout
        assert "is not the main of the code's cluster" in copied.stderr
    finally:
        for fake in fakes:
            fake.kill()
            fake.wait()
    asked = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(a["method"], a["path"]) for a in asked] == [("GET", "/v1/pair/ca")] * 2
    assert secret not in log.read_text() and code.split("-")[1] not in log.read_text()
    refusals = audited(c, "n2", "node.join", home="n2-fake")
    assert [r["outcome"] for r in refusals] == ["denied", "denied"]
    # nothing changed on the candidate, and the code still works at the real main
    assert json.loads(c.ok("n2", "status", "--json", home="n2-fake"))["role"] == "candidate"
    c.ok("n2", "join", main_at(c), code, home="n2-fake")
    assert "n2fake" in children(c)


def test_twenty_wrong_guesses_are_refused_and_burn_the_code(cluster: Cluster) -> None:
    c = cluster
    code = new_code(c)
    result = c.lab.run("outsider", PY, "-c", GUESSES, main_at(c), code, timeout=180)
    assert result.returncode == 0, result.stderr
    said = result.stdout.splitlines()
    assert len(said) == 20 and "ENROLLED" not in said
    assert all("the main refused" in s for s in said), said
    assert sum("wrong join code" in s for s in said) == 5
    assert sum("burnt" in s for s in said) == 15
    # burnt: the right secret is refused now too
    right = c.cli("n2", "join", main_at(c), code, "--name", "right", home="n2-burnt")
    assert right.returncode == 1 and "burnt" in right.stderr
    assert not {"right", *(f"guess{i}" for i in range(20))} & set(children(c))
    assert any(
        r["detail"] == "join code burnt after 5 wrong proofs"
        for r in audited(c, "main", "node.join")
    )
    c.wait(lambda: main_refused(c, "join: wrong proof"), "the wrong proofs audited")
