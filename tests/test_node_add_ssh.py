"""`letsinfer node add --ssh HOST` on a lab of real hosts: a main (made by
hand, behind the table firewall.yml writes and loads: members only on control
and agent ports), n1 (fresh, onboarded), n2 (fails doctor: its agent port is
taken), n3 (onboarded after n1, whose table must admit it too) and an
outsider (a LAN host in no letsinfer group) that tries every protected port
n1 listens on while the onboarding runs and after it. A reboot is played by
deleting a host's table and loading its file again, as the unit does at boot.

The outsider's view (listening ports, connection tries from a network
namespace) is tests/lab/probes.py, shared with tests/test_ansible_onboarding.py.
Needs root, like CI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.lab.netns import Lab, port_open, running_lab
from tests.lab.probes import connects, enter_network_namespace, listening_ports, protected

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ("main", "n1", "n2", "n3", "outsider")
LETSINFER = "/opt/letsinfer/current/bin/letsinfer"
# what lab hosts need: /usr is shared, so nothing is linked there; one engine thread
LAB_VARS = ("node_cli_link=", "node_man_dir=/opt/man/man1", "node_engine_threads=1")
BIN = Path(sys.executable).parent
# The firewall role's file, what a systemd unit loads at boot, and the folder
# of members `node add --ssh` admits (the role's defaults)
RULES = "/etc/nftables.d/letsinfer.nft"
MEMBERS = "/etc/nftables.d/letsinfer.members.d"

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("sshd", "nft", "nc", "nsenter")),
        reason="the lab needs root, openssh-server, nftables, netcat-openbsd and util-linux",
    ),
    pytest.mark.timeout(1200),  # two onboarding runs and a placement on a loaded 2-core machine
]


# -- the outsider's view -------------------------------------------------------


@dataclass
class Watch:
    """The outsider trying, round after round, every protected port it finds
    listening on ``host``."""

    lab: Lab
    host: str
    tries: list[tuple[int, bool]] = field(default_factory=list)  # (port, reached)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def _run(self) -> None:
        try:
            enter_network_namespace(self.lab.hosts["outsider"].namespace)
            target = self.lab.hosts[self.host]
            sshd = int((Path(target.workdir) / "sshd.pid").read_text())
            while not self._stop.is_set():
                ports = sorted(filter(protected, listening_ports(sshd)))
                accepted = connects([(target.address, p) for p in ports])
                self.tries += [(p, (target.address, p) in accepted) for p in ports]
                self._stop.wait(0.2)
        except BaseException as exc:  # reported by stop()
            self._error = exc

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="outsider-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)
        if self._error is not None:
            raise self._error


# -- the lab ------------------------------------------------------------------------


def plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LETSINFER_")}


def on_main(lab: Lab, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`letsinfer ARGS` run by the operator on the main (this checkout's letsinfer)."""
    argv = lab.hosts["main"].nsenter(sys.executable, "-m", "letsinfer", *args)
    return subprocess.run(
        argv, capture_output=True, text=True, env=plain_env(), cwd=ROOT, timeout=timeout
    )


def ok_on_main(lab: Lab, *args: str) -> str:
    result = on_main(lab, *args)
    assert result.returncode == 0, f"letsinfer {' '.join(args)}: {result.stdout}{result.stderr}"
    return result.stdout


def sh(lab: Lab, host: str, command: str) -> str:
    result = lab.ssh(host, command, timeout=120)
    assert result.returncode == 0, f"{host}: {command}: {result.stderr}"
    return result.stdout.strip()


def add_over_ssh(
    lab: Lab, wheels: Path, host: str, *args: str, as_json: bool = True
) -> subprocess.CompletedProcess[str]:
    extra = [a for v in LAB_VARS for a in ("-e", v)]
    return on_main(
        lab,
        *("node", "add", host, "--ssh", lab.hosts[host].address, "--identity", lab.key),
        *("--wheelhouse", str(wheels), *extra, *args),
        *(["--json"] if as_json else []),
    )


def what_letsinfer_left(lab: Lab, host: str) -> dict[str, str]:
    """Every trace onboarding leaves on a host: files, unit, firewall table, processes."""
    probes = {
        "install": "ls -A /opt/letsinfer",
        "config": "ls -A /etc/letsinfer",
        "state": "ls -A /var/lib/letsinfer",
        "unit": "ls /etc/systemd/system/letsinfer.service",
        "rules": "ls /etc/nftables.d/letsinfer.nft",
        "table": "nft list table inet letsinfer",
    }
    found = {}
    for what, command in probes.items():
        result = lab.ssh(host, command)
        if result.returncode == 0 and result.stdout.strip():
            found[what] = result.stdout.strip()
    if processes := letsinfer_processes(lab, host):
        found["processes"] = "\n".join(processes)
    return found


def letsinfer_processes(lab: Lab, host: str) -> list[str]:
    """Command lines of processes in ``host``'s filesystem view that run letsinfer
    (the PID namespace is the machine's: other tests' nodes are left out)."""
    sshd = int((Path(lab.hosts[host].workdir) / "sshd.pid").read_text())
    view = os.stat(f"/proc/{sshd}/ns/mnt").st_ino
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry / "ns" / "mnt").st_ino != view:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "/opt/letsinfer" in cmdline or " -m letsinfer" in cmdline:
            found.append(cmdline)
    return found


@dataclass
class Story:
    run1: subprocess.CompletedProcess[str]
    run2: subprocess.CompletedProcess[str]
    served: bool  # n1's placement group answered a request through the gateway
    requests: list[str]  # what happened to each request
    watch: Watch
    after: set[tuple[str, int]]  # n1's protected ports the outsider reached once it was all done
    main_reaches: set[tuple[str, int]]  # the same ports from the main
    main_rules_before: str  # the main's table file (its checksum) before node add
    main_rules_after: str  # and after both runs


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab(list(HOSTS)) as the_lab:
        yield the_lab


@pytest.fixture(scope="module")
def main(lab: Lab) -> Lab:
    """The main, made by hand (one engine thread, no metrics port), behind its table."""
    sh(lab, "main", "mkdir -p /etc/letsinfer && printf '[engine]\\nthreads = 1\\n' "
       "> /etc/letsinfer/config.toml")  # fmt: skip
    load_main_table(lab)
    ok_on_main(lab, "node", "init", "--main", "--name", "main")
    ok_on_main(lab, "service", "start", "--json", "--timeout", "150")
    return lab


def load_main_table(lab: Lab) -> None:
    """firewall.yml on the main alone, run there (as site.yml leaves a main):
    letsinfer's table written to RULES and loaded; its metrics port open to
    one listed source, a setting node add must not lose."""
    main = lab.hosts["main"]
    inventory = {
        "letsinfer_main": {
            "hosts": {
                "main": {
                    "ansible_connection": "local",
                    "ansible_host": main.address,
                    "ansible_python_interpreter": sys.executable,
                    "firewall_metrics_sources": ["10.77.0.250/32"],
                }
            }
        }
    }
    hosts = Path(main.workdir) / "firewall-inventory.json"
    hosts.write_text(json.dumps(inventory))
    # nsenter starts in /: ansible.cfg (where the collection is) is ROOT's
    argv = ["env", "-C", str(ROOT), str(BIN / "ansible-playbook"), "-i", str(hosts)]
    argv.append("playbooks/firewall.yml")
    env = {**plain_env(), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        main.nsenter(*argv), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "10.77.0.250" in sh(lab, "main", "nft list set inet letsinfer metrics_v4")


def reboot_table(lab: Lab, host: str) -> None:
    """What a reboot does to the host's letsinfer table: gone, then loaded
    from the firewall role's file, as the unit's ExecStartPre does."""
    sh(lab, host, f"nft delete table inet letsinfer && nft -f {RULES}")


@pytest.fixture(scope="module")
def story(main: Lab, wheels: Path) -> Iterator[Story]:
    lab = main
    rules_before = sh(lab, "main", f"sha256sum {RULES}")
    watch = Watch(lab, "n1")
    watch.start()
    try:
        run1 = add_over_ssh(lab, wheels, "n1")
        assert run1.returncode == 0, run1.stdout + run1.stderr
        ok_on_main(lab, "model", "install", "tiny", "--node", "n1", "--target", "cpu", "--yes")
        served, requests = serve_through_n1(lab)
        run2 = add_over_ssh(lab, wheels, "n1", as_json=False)
        time.sleep(2)  # a few more rounds on the finished host
    finally:
        watch.stop()
    n1 = lab.hosts["n1"]
    ports = sorted(
        filter(protected, listening_ports(int(Path(n1.workdir, "sshd.pid").read_text())))
    )
    targets = [(n1.address, p) for p in ports]
    result: list[set[tuple[str, int]]] = []
    for host in ("outsider", "main"):
        probe = threading.Thread(
            target=lambda h=host: (
                enter_network_namespace(lab.hosts[h].namespace),
                result.append(connects(targets)),
            )
        )
        probe.start()
        probe.join()
    rules_after = sh(lab, "main", f"sha256sum {RULES}")
    yield Story(
        run1, run2, served, requests, watch, result[0], result[1], rules_before, rules_after
    )


def serve_through_n1(lab: Lab, timeout: float = 300) -> tuple[bool, list[str]]:
    """Chat requests to the main's gateway from the LAN (each with its own
    X-Request-Id) until `letsinfer request ID` on the main says node n1 served
    one with 200; and what happened to each request."""
    key = json.loads(ok_on_main(lab, "auth", "key", "create", "lab", "--json"))["key"]
    url = f"http://{lab.hosts['main'].address}:8000/v1/chat/completions"
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        request_id = f"nadd-{len(seen)}"
        # A prompt of its own each time, long enough to carry an affinity
        # hint: with none, two idle replicas tie and the first (the main's own
        # group) always wins; one prompt would always go to the same replica.
        said = {"role": "user", "content": f"{request_id}: please answer this test with a greeting"}
        body = json.dumps({"model": "tiny", "messages": [said]})
        answer = subprocess.run(
            lab.hosts["outsider"].nsenter(
                *("curl", "-s", "-m", "30", "-w", "\n%{http_code}", url),
                *("-H", f"authorization: Bearer {key}", "-H", "content-type: application/json"),
                *("-H", f"x-request-id: {request_id}", "--data-binary", body),
            ),
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        text, _, code = answer.rpartition("\n")
        seen.append(f"{request_id}: HTTP {code} {text[:300]}")
        for _ in range(10):  # its record is written just after the answer
            shown = on_main(lab, "request", request_id, "--json")
            if shown.returncode == 0:
                rows = json.loads(shown.stdout)
                seen[-1] += f" {rows}"
                if any(r.get("node") == "n1" and r.get("status") == 200 for r in rows):
                    return True, seen
                break
            time.sleep(1)
        time.sleep(2)
    return False, seen


# -- what the operator and the outsider see ----------------------------------------


def test_node_add_ssh_onboards_a_fresh_host_that_serves_a_placement(
    main: Lab, story: Story
) -> None:
    answer = json.loads(story.run1.stdout)
    assert answer["result"] == "onboarded" and answer["changed"] > 0
    nodes = {n["name"]: n for n in json.loads(ok_on_main(main, "node", "list", "--json"))}
    assert nodes["n1"]["state"] == "active" and nodes["n1"]["role"] == "child"
    status = json.loads(sh(main, "n1", f"{LETSINFER} status --json"))
    status = status[0] if isinstance(status, list) else status
    main_status = json.loads(ok_on_main(main, "status", "--json"))
    main_status = main_status[0] if isinstance(main_status, list) else main_status
    assert status["ca_fingerprint"] == main_status["ca_fingerprint"]  # bound to this main's CA
    assert story.served, story.requests
    # the main's table admits the new member (the child reaches the control port)
    assert main.hosts["n1"].address in sh(main, "main", "nft list set inet letsinfer members_v4")


def test_the_outsider_never_reaches_the_new_node_s_planes(story: Story) -> None:
    seen = {port for port, _ in story.watch.tries}
    assert 8444 in seen, f"the agent never listened while watched: {sorted(seen)}"
    assert any(21000 <= p <= 29999 for p in seen), f"no engine port watched: {sorted(seen)}"
    reached = sorted({port for port, ok in story.watch.tries if ok})
    assert reached == [], f"the outsider reached n1 on {reached} during onboarding"
    assert story.after == set(), f"the outsider reaches n1 afterwards: {story.after}"
    # the table filters by member, it does not drop everything: the main gets in
    assert {port for _, port in story.main_reaches} >= {8444}


def test_a_rerun_changes_nothing_and_says_so(main: Lab, story: Story) -> None:
    assert story.run2.returncode == 0, story.run2.stdout + story.run2.stderr
    assert "already a child of this cluster: nothing changed" in story.run2.stdout
    assert "summary" in story.run2.stdout  # the live view's last table


def test_the_main_admits_the_new_member_after_a_reboot(main: Lab, story: Story) -> None:
    """The main's table file (what its unit loads at boot, and what site.yml
    wrote) keeps n1: after the table is gone and loaded again from that file,
    n1 reaches the control port and the outsider still reaches nothing."""
    address = main.hosts["main"].address
    reboot_table(main, "main")
    assert port_open(main, address, 8443, from_host="n1")
    assert not port_open(main, address, 8443, from_host="outsider")
    assert not port_open(main, address, 8444, from_host="outsider")
    # site.yml's own settings are kept: its file is the one it wrote
    assert story.main_rules_after == story.main_rules_before
    assert "10.77.0.250" in sh(main, "main", "nft list set inet letsinfer metrics_v4")
    assert main.hosts["n1"].address in sh(main, "main", f"cat {MEMBERS}/n1.nft")


@pytest.fixture(scope="module")
def later(main: Lab, story: Story, wheels: Path) -> subprocess.CompletedProcess[str]:
    """n3, onboarded once n1 is a child."""
    return add_over_ssh(main, wheels, "n3")


def test_a_child_added_later_is_admitted_by_the_children_already_there(
    main: Lab, later: subprocess.CompletedProcess[str]
) -> None:
    """Children admit members on their agent port (link proofs) and task
    ports: n1's table admits n3, live and after a reboot; n3's admits n1."""
    assert later.returncode == 0, later.stdout + later.stderr
    n1, n3 = main.hosts["n1"].address, main.hosts["n3"].address
    assert port_open(main, n1, 8444, from_host="n3")
    reboot_table(main, "n1")
    assert port_open(main, n1, 8444, from_host="n3")
    assert not port_open(main, n1, 8444, from_host="outsider")
    assert port_open(main, n3, 8444, from_host="n1")
    assert not port_open(main, n3, 8444, from_host="outsider")
    assert json.loads(later.stdout)["warnings"] == []  # every child was reached


def test_a_host_failing_doctor_is_left_unchanged(main: Lab, wheels: Path) -> None:
    """n2's agent port is taken: doctor (run from the wheel, before anything is
    installed) names the port, and n2 has no letsinfer file, unit, table or process."""
    holder = subprocess.Popen(
        [
            "ip",
            *("netns", "exec", main.hosts["n2"].namespace, sys.executable, "-c"),
            "import socket, time; s = socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('0.0.0.0', 8444)); s.listen(); print('ready', flush=True); time.sleep(900)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        result = add_over_ssh(main, wheels, "n2")
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode != 0
    answer = json.loads(result.stdout)
    assert answer["result"] == "failed"
    message = " ".join(f["message"] for f in answer["failures"])
    assert "doctor failed on n2" in message and "8444" in message, message
    assert what_letsinfer_left(main, "n2") == {}
    nodes = {n["name"] for n in json.loads(ok_on_main(main, "node", "list", "--json"))}
    assert "n2" not in nodes
    members = sh(main, "main", "nft list set inet letsinfer members_v4")
    assert main.hosts["n2"].address not in members


def test_ssh_problems_are_named_and_change_nothing(main: Lab, tmp_path: Path) -> None:
    n2 = main.hosts["n2"].address
    unreachable = on_main(
        main, "node", "add", "ghost", "--ssh", "10.77.0.250", "--identity", main.key
    )
    assert unreachable.returncode != 0
    assert "cannot reach 10.77.0.250 on SSH port 22" in unreachable.stderr

    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    refused = on_main(main, "node", "add", "n2", "--ssh", n2, "--identity", str(stranger))
    assert refused.returncode != 0
    assert f"root@{n2} refused the key {stranger}" in refused.stderr

    # the main knows another key for n2's address (a machine answering in its place)
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    other_key = Path(str(other) + ".pub").read_text().split()[:2]
    sh(main, "main", f"mkdir -p /root/.ssh; ssh-keygen -R {n2} >/dev/null 2>&1; "
       f"echo '{n2} {' '.join(other_key)}' >> /root/.ssh/known_hosts")  # fmt: skip
    try:
        mismatch = on_main(main, "node", "add", "n2", "--ssh", n2, "--identity", main.key)
    finally:
        sh(main, "main", f"ssh-keygen -R {n2} >/dev/null 2>&1; true")
    assert mismatch.returncode != 0
    assert f"host key mismatch for {n2}" in mismatch.stderr
    assert what_letsinfer_left(main, "n2") == {}
