"""`letsinfer doctor` on one machine, and `doctor --cluster`'s invariants: each
problem named with its fix, exit 1 on any failure. The cluster checks against
a real cluster run in tests/test_cluster_serving.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from letsinfer.doctor.clock import FixedOffset, HttpTimeSource, SntpSource, check_clock, parse_ntp
from letsinfer.doctor.cluster import ClusterState, check_cluster
from letsinfer.doctor.gpus import check_gpus, open_probe
from letsinfer.store import GpuClaim, NodeRecord, PlacementGroupRecord
from tests.nodes import free_port, letsinfer
from tests.ntp_server import SkewedNtpServer

ROOT = Path(__file__).resolve().parent.parent
# How site.yml runs doctor before install: the system Python, no site
# packages, letsinfer from the wheel (here: from the checkout) alone.
PRE_INSTALL = (
    "import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); "
    "runpy.run_module('letsinfer.doctor', run_name='__main__', alter_sys=True)"
)


def failing(report: dict[str, object]) -> dict[str, str]:
    return {
        f["check"]: f["message"]
        for f in report["findings"]  # type: ignore[attr-defined]
        if f["level"] == "fail"
    }


@contextmanager
def listening(port: int) -> Iterator[socket.socket]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield s


@contextmanager
def date_server(skew_s: float) -> Iterator[str]:
    """An HTTP server whose Date header is ``skew_s`` off (and no JSON time)."""

    class Handler(BaseHTTPRequestHandler):
        def date_time_string(self, timestamp: float | None = None) -> str:
            return formatdate(time.time() + skew_s, usegmt=True)

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/health"
    finally:
        server.shutdown()
        server.server_close()


def test_the_clock_is_measured_against_ntp_or_the_mains_date() -> None:
    with SkewedNtpServer(skew_s=120) as ntp:
        measured = parse_ntp(ntp.address).measure()
        assert 119 < measured.offset_s < 121 and measured.error_s < 1
        finding = check_clock([parse_ntp(ntp.address)])
    assert finding.level == "fail" and "behind" in finding.message and finding.fix
    with date_server(-90) as url:
        m = HttpTimeSource(url).measure()
        assert -91.6 < m.offset_s < -88.4, m
        said = check_clock([HttpTimeSource(url)]).message
        assert "s ahead of" in said and url in said, said  # the Date header: 1 s steps
    assert check_clock([FixedOffset(0.3)]).level == "ok"
    assert check_clock([FixedOffset(-5)]).level == "warn"
    assert "ahead of" in check_clock([FixedOffset(-5)]).message
    assert check_clock([FixedOffset(30)]).level == "fail"
    # A reference that does not answer: not checked, which warns, never fails;
    # the next reference in the list decides.
    silent = SntpSource("127.0.0.1", free_port(), timeout_s=0.3)
    assert check_clock([silent]).level == "warn"
    assert check_clock([silent, FixedOffset(15)]).level == "fail"


def test_gpus_through_the_nvml_seam(tmp_path: Path) -> None:
    gib = 1 << 30
    fake = tmp_path / "gpus.json"
    fake.write_text(
        json.dumps(
            {
                "driver": "550.54.15",
                "gpus": [
                    {
                        "uuid": "GPU-ok",
                        "name": "H100",
                        "memory_total": 80 * gib,
                        "temperature_c": 41,
                    },
                    {
                        "uuid": "GPU-ecc",
                        "name": "H100",
                        "memory_total": 80 * gib,
                        "ecc_uncorrected": 2,
                    },
                    {
                        "uuid": "GPU-hot",
                        "name": "H100",
                        "memory_total": 80 * gib,
                        "temperature_c": 97,
                    },
                    {"uuid": "GPU-mig", "name": "H100", "memory_total": 40 * gib, "mig": True},
                ],
            }
        )
    )
    found = {f.check: f for f in check_gpus(str(fake), open_probe)}
    assert "550.54.15" in found["gpus"].message and "4 GPU(s)" in found["gpus"].message
    assert found["gpu GPU-ok"].level == "ok" and "41°C" in found["gpu GPU-ok"].message
    assert (
        found["gpu GPU-ecc"].level == "fail" and "2 uncorrected ECC" in found["gpu GPU-ecc"].message
    )
    assert found["gpu GPU-hot"].level == "fail" and "97°C" in found["gpu GPU-hot"].message
    assert found["gpu GPU-mig"].level == "warn" and "MIG" in found["gpu GPU-mig"].message


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs as the home (root)")
def test_doctor_names_a_skewed_clock_a_taken_port_and_a_nearly_full_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(home)], check=True)
    gateway = free_port()
    env = {
        "LETSINFER_GATEWAY__HOST": "127.0.0.1",
        "LETSINFER_GATEWAY__PORT": str(gateway),
        "LETSINFER_GATEWAY__METRICS_PORT": "0",
        "LETSINFER_CONTROL__HOST": "127.0.0.1",
        "LETSINFER_CONTROL__PORT": str(free_port()),
        "LETSINFER_AGENT__API_HOST": "127.0.0.1",
        "LETSINFER_AGENT__API_PORT": str(free_port()),
        "LETSINFER_DISCOVERY__ENABLED": "false",
    }
    try:
        with SkewedNtpServer(skew_s=0) as ntp:
            fine = letsinfer(home, "doctor", "--ntp", ntp.address, "--json", env=env)
        assert fine.returncode == 0, fine.stdout + fine.stderr
        assert json.loads(fine.stdout)["ok"] is True
        [said] = [
            f["message"] for f in json.loads(fine.stdout)["findings"] if f["check"] == "config"
        ]
        assert said.endswith("config.toml: the defaults apply (and any LETSINFER_* variables)")

        with open(home / "ballast", "wb") as fh:  # the home's filesystem 97% full
            os.posix_fallocate(fh.fileno(), 0, 155 << 20)
        with listening(gateway), SkewedNtpServer(skew_s=300) as ntp:
            sick = letsinfer(home, "doctor", "--ntp", ntp.address, "--json", env=env)
            text = letsinfer(home, "doctor", "--ntp", ntp.address, env=env)
    finally:
        subprocess.run(["umount", str(home)], check=True)
    assert sick.returncode == 1, sick.stdout + sick.stderr
    report = json.loads(sick.stdout)
    assert report["ok"] is False and report["failures"] == 3
    failed = failing(report)
    assert set(failed) == {"clock", f"port {gateway}", "disk"}, failed
    assert "300" in failed["clock"] or "299" in failed["clock"]
    assert f"pid {os.getpid()}" in failed[f"port {gateway}"]
    assert "nearly full" in failed["disk"] and str(home) in failed["disk"]
    assert all(f["fix"] for f in report["findings"] if f["level"] == "fail")
    assert text.returncode == 1
    for line in ("FAIL clock", f"FAIL port {gateway}", "FAIL disk", "3 failure(s)"):
        assert line in text.stdout, text.stdout


def test_doctor_before_install_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    """What site.yml runs on a host without letsinfer: `python -S` (no site
    packages) with only the letsinfer package on the path."""
    agent = free_port()
    argv = [
        sys.executable,
        "-S",
        "-c",
        PRE_INSTALL,
        str(ROOT),
        "--home",
        str(tmp_path / "home"),
        "--port",
        f"agent=127.0.0.1:{agent}",
        "--no-discovery",
        "--json",
    ]
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    free = subprocess.run(argv, capture_output=True, text=True, env=clean, timeout=60)
    assert free.returncode == 0, free.stderr
    checks = {f["check"] for f in json.loads(free.stdout)["findings"]}
    assert {"python", "gpus", "open files", "disk", "clock", f"port {agent}", "mdns"} <= checks
    with listening(agent):
        taken = subprocess.run(argv, capture_output=True, text=True, env=clean, timeout=60)
    assert taken.returncode == 1, taken.stderr
    assert set(failing(json.loads(taken.stdout))) == {f"port {agent}"}


def _node(name: str, role: str = "child", **kw: object) -> NodeRecord:
    now = time.time()
    fields: dict[str, object] = {
        "id": f"id-{name}",
        "name": name,
        "role": role,
        "address": None,
        "state": "active",
        "paused": False,
        "created_at": now,
        "facts": {"gpus": [{"uuid": f"GPU-{name}"}], "firewall": True},
        "facts_at": now - 1,
        "cert_not_after": now + 20 * 86400,
    }
    fields.update(kw)
    return NodeRecord(**fields)  # type: ignore[arg-type]


def _group(pg: str, node: str, **kw: object) -> PlacementGroupRecord:
    fields: dict[str, object] = {
        "id": pg,
        "service": "chat",
        "node_id": f"id-{node}",
        "release_id": "r",
        "target": "cpu",
        "desired": "running",
        "state": "ready",
        "endpoint": None,
        "pid": None,
        "capacity": None,
        "restarts": 0,
        "detail": None,
        "created_at": 0.0,
        "updated_at": 0.0,
    }
    fields.update(kw)
    return PlacementGroupRecord(**fields)  # type: ignore[arg-type]


def _state(
    nodes: list[NodeRecord], groups: list[PlacementGroupRecord], **kw: object
) -> ClusterState:
    fields: dict[str, object] = {
        "main_id": "id-main",
        "main_pid": 42,
        "main_cert_not_after": time.time() + 20 * 86400,
        "nodes": nodes,
        "groups": groups,
        "claims": [GpuClaim("GPU-n1", "pg-1", "id-n1", "0")],
        "anchor_problems": [],
        "stale_after_s": 20.0,
        "now": time.time(),
    }
    fields.update(kw)
    return ClusterState(**fields)  # type: ignore[arg-type]


def test_a_clean_cluster_passes_and_each_violation_is_named() -> None:
    main, n1 = _node("main", "main"), _node("n1")
    clean = check_cluster(_state([main, n1], [_group("pg-1", "n1")]))
    assert [f for f in clean if f.level != "ok"] == [], clean

    now = time.time()
    broken = _state(
        [
            main,
            _node("n1", facts_at=now - 300, facts={"gpus": [{"uuid": "GPU-n1"}]}),
            _node("n2", cert_not_after=now - 3600, audit_problem="the chain was cut"),
            _node("n3", facts={"gpus": [], "firewall": False}),
        ],
        [
            _group("pg-1", "n1"),
            _group("pg-2", "n3", state="parked", detail="failed to start 5 times"),
            _group("pg-3", "n3", paused_reason="data link n3-n2 lost"),
            _group("pg-4", "n3", desired="stopped", state="stopped"),
        ],
        claims=[
            GpuClaim("GPU-n1", "pg-1", "id-n1", "0"),
            GpuClaim("GPU-n1", "pg-9", "id-n1", "0"),
            GpuClaim("GPU-gone", "pg-2", "id-n3", "0"),
        ],
        main_pid=None,
        main_cert_not_after=now + 2 * 86400,
        anchor_problems=["the chain was rewritten"],
    )
    failed = {f.check: f.message for f in check_cluster(broken) if f.level == "fail"}
    assert "not running" in failed["main"]
    assert "the chain was rewritten" in failed["audit main"]
    assert "held by 2 placement groups" in failed["gpu GPU-n1"]
    assert "no longer reports it" in failed["gpu GPU-gone"]
    assert "expires" in failed["certificate main"] and "2.0 days" in failed["certificate main"]
    assert "expired" in failed["certificate n2"]
    assert "sent no facts for 300s" in failed["facts n1"]
    assert "the chain was cut" in failed["audit n2"]
    assert "firewall n3" not in failed and "firewall n1" not in failed  # warnings (below)
    assert "stale" in failed["group pg-1"]
    assert "parked: failed to start 5 times" in failed["group pg-2"]
    assert "paused: data link n3-n2 lost" in failed["group pg-3"]
    assert "group pg-4" not in failed  # stopped on purpose: not meant to run


def test_a_missing_firewall_table_gets_one_verdict_and_a_fix_that_works(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from letsinfer.doctor import firewall

    monkeypatch.setattr(firewall, "RULES_FILE", tmp_path / "letsinfer.nft")  # not written
    here = firewall.firewall_finding(False)
    there = firewall.firewall_finding(False, node="n3")
    assert here.level == there.level == "warn"
    assert "no nftables table" in here.message and "no nftables table" in there.message
    assert "nft -f" not in here.fix, "no file to load: the role writes it"
    assert "letsinfer fleet apply firewall" in here.fix
    (tmp_path / "letsinfer.nft").write_text("table inet letsinfer {}\n")
    assert firewall.firewall_finding(False).fix == f"nft -f {tmp_path / 'letsinfer.nft'}"
    assert firewall.firewall_finding(True).level == "ok"


_FORKING_NODE = """
import os, socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
child = os.fork()  # holds the listening socket as a forked engine does until it execs
if child == 0:
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def test_a_port_held_by_the_node_and_a_child_it_forked_is_the_node_s_own() -> None:
    """A re-run of site.yml failed the doctor on the main ("gateway port 8000
    is taken by python3 (pid A), python3 (pid B)"): B was a process the node
    had just forked, not yet running its own program. A process outside the
    node holding the port still fails the check."""
    from letsinfer.doctor.ports import Port, check_port, listeners, owners

    node = subprocess.Popen(
        [sys.executable, "-c", _FORKING_NODE], stdout=subprocess.PIPE, text=True
    )
    assert node.stdout is not None
    child = 0
    try:
        port = int(node.stdout.readline())
        child = int(node.stdout.readline())
        assert set(owners(listeners(port, "127.0.0.1"))) == {node.pid, child}
        gateway = Port("gateway", "127.0.0.1", port, "[gateway] port")
        assert check_port(gateway, {node.pid}).level == "ok"
        elsewhere = check_port(gateway, {2**22 + 7})  # no such process: not the node's
        assert elsewhere.level == "fail"
        assert f"(pid {node.pid})" in elsewhere.message and f"(pid {child})" in elsewhere.message
    finally:
        if child:
            os.kill(child, 9)
        node.kill()
        node.wait()
