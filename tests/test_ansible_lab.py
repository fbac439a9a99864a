"""The playbooks against a lab of real hosts (namespaces with sshd, nftables,
their own /etc, /var/lib and /opt): a rolling upgrade to a broken build and
wipe (onboarding one machine over SSH: tests/test_node_add_ssh.py). Needs root,
like CI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from tests.lab import wheelhouse
from tests.lab.netns import Lab, printed, running_lab

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("sshd", "nft", "nc", "nsenter")),
        reason="the lab needs root, openssh-server, nftables, netcat-openbsd and util-linux",
    ),
    pytest.mark.timeout(1200),  # a converged lab, then upgrade.yml runs, on a loaded 2-core machine
]


@pytest.fixture(scope="module")
def lab(wheels: Path) -> Iterator[Lab]:
    with running_lab(["main", "n1"]) as the_lab:
        yield the_lab


def env(lab: Lab, wheels: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "LETSINFER_LAB_PREFIX": lab.prefix,
        "LETSINFER_LAB_WHEELHOUSE": str(wheels),
        "ANSIBLE_FORCE_COLOR": "0",
    }


def playbook(lab: Lab, wheels: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "inventories/lab", f"playbooks/{name}", *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(lab, wheels),
        stdin=subprocess.DEVNULL,
        timeout=600,
    )


# What the man-page test checks on n1, read right after site.yml (an upgrade
# test moves n1 to another release).
MAN_CHECKS = (
    "man -M /opt/man -w letsinfer-model-pull",
    "readlink /opt/man/man1/letsinfer-model-pull.1",
    "cat /opt/man/man1/letsinfer-model-pull.1",
    "MANWIDTH=100 man -M /opt/man letsinfer-model-pull",
    "ls /opt/man/man1",
)


@dataclass
class Site:
    """The module's lab and whether it holds site.yml's result, so that each
    test gets converged hosts whatever ran before it (site.yml again only
    after the wipe test)."""

    lab: Lab
    wheels: Path
    converged: bool = False  # site.yml's result, not wiped since
    man: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def converge(self) -> None:
        """site.yml (which loads the firewall table too) through `letsinfer
        fleet apply`, as an operator runs it."""
        if self.converged:
            return
        result = subprocess.run(
            [sys.executable, "-m", "letsinfer", "fleet", "apply", "site", "-i", "inventories/lab"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env(self.lab, self.wheels),
            timeout=600,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "summary" in result.stdout
        self.man = {command: self.lab.ssh("n1", command) for command in MAN_CHECKS}
        self.converged = True


@pytest.fixture(scope="module")
def site(lab: Lab, wheels: Path) -> Site:
    return Site(lab, wheels)


@pytest.fixture
def converged(site: Site) -> Lab:
    site.converge()
    return site.lab


@pytest.fixture
def bare(site: Site) -> Iterator[Lab]:
    """Hosts nothing was installed on: the module's lab while letsinfer has
    written none of its paths there (before site.yml first runs), else a lab
    of its own."""
    written = "ls -A /opt/letsinfer /etc/letsinfer /var/lib/letsinfer 2>/dev/null; true"
    if not any(sh(site.lab, host, written) for host in site.lab.hosts):
        yield site.lab
        return
    with running_lab(["main", "n1"]) as fresh:
        yield fresh


def sh(lab: Lab, host: str, command: str) -> str:
    return printed(lab.ssh(host, command))


def healthy(lab: Lab, host: str, timeout: float = 60) -> bool:
    """GET /health from the LAN (the controller's namespace) until it answers 200."""
    url = f"http://{lab.hosts[host].address}:8000/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        probe = subprocess.run(
            lab.in_ctl("curl", "-sf", "-m", "5", url), capture_output=True, text=True
        )
        if probe.returncode == 0:
            return True
        time.sleep(0.5)
    return False


def active_child(lab: Lab, child: str, since: float = 0, timeout: float = 60) -> bool:
    """Whether the main lists ``child`` active (heard from after ``since``, a Unix
    time): a child runs no gateway, so this is its health."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = lab.ssh("main", "/opt/letsinfer/current/bin/letsinfer node list --json")
        if listed.returncode == 0:
            for n in json.loads(listed.stdout):
                seen = n.get("last_seen")
                when = datetime.fromisoformat(seen).timestamp() if seen else 0
                if n["name"] == child and n["state"] == "active" and when >= since:
                    return True
        time.sleep(1)
    return False


def node_status(lab: Lab, host: str) -> dict[str, object]:
    data = json.loads(sh(lab, host, "/opt/letsinfer/current/bin/letsinfer status --json"))
    return dict(data)


def letsinfer_processes(lab: Lab, host: str) -> list[str]:
    """Command lines of processes in ``host``'s filesystem view that run letsinfer
    (a node, an engine, anything started from the install root)."""
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


# Chat requests against the main's gateway from the LAN, four at a time (so that
# both of tiny's placement groups get some), until FLAG exists: the statuses.
CLIENT = """
import json, sys, time, pathlib, httpx
from concurrent.futures import ThreadPoolExecutor
url, key, flag = sys.argv[1:]
def ask(_):
    statuses = []
    with httpx.Client(timeout=30) as c:
        while not pathlib.Path(flag).exists() or not statuses:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
            try:
                r = c.post(url, json=body, headers={"authorization": "Bearer " + key})
                statuses.append(r.status_code)
            except httpx.HTTPError:
                statuses.append(-1)
            time.sleep(0.05)
    return statuses
with ThreadPoolExecutor(4) as pool:
    print(json.dumps([s for part in pool.map(ask, range(4)) for s in part]))
"""


def tiny_on(lab: Lab, node: str) -> dict[str, object]:
    """The tiny model's placement group on ``node``, as the main shows it."""
    cli = "/opt/letsinfer/current/bin/letsinfer"
    shown = json.loads(sh(lab, "main", f"{cli} model show tiny --json"))
    return next((pg for pg in shown["placement_groups"] if pg["node"] == node), {})


@pytest.fixture
def tiny_ready_on_n1(converged: Lab) -> dict[str, object]:
    """The tiny model's placement group on n1 once its engine is ready: the main
    places it there (main_placements) after site.yml enrolled n1."""
    deadline = time.monotonic() + 180
    while True:
        engine = tiny_on(converged, "n1")
        if engine.get("state") == "ready" and engine.get("pid"):
            return engine
        assert time.monotonic() < deadline, f"tiny not ready on n1: {engine}"
        time.sleep(1)


def served_by(lab: Lab, pg_id: object) -> int:
    log = "/var/lib/letsinfer/logs/node.log"
    return int(sh(lab, "main", f"grep -c 'pg={pg_id} status=200' {log} || true"))


def test_site_changes_nothing_when_a_host_fails_doctor(bare: Lab, wheels: Path) -> None:
    """n1's agent port is taken: site.yml's doctor (run from the wheel, before
    anything is installed) names n1 and the port, and no host is changed."""
    lab = bare
    holder = subprocess.Popen(
        [
            "ip",
            *("netns", "exec", lab.hosts["n1"].namespace, sys.executable, "-c"),
            "import socket, time; s = socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('0.0.0.0', 8444)); s.listen(); print('ready', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        result = playbook(lab, wheels, "site.yml", "-v")  # -v: the temporary folders it made
    finally:
        holder.kill()
        holder.wait()
    out = " ".join(result.stdout.split())
    # /tmp is the machine's own, shared by every lab host and by other modules'
    # playbooks: the folders to look for are the ones this run named.
    made = set(re.findall(r"(/\S+?-letsinfer-doctor)\b", result.stdout))
    assert len(made) >= 2, result.stdout  # the hosts' and the controller's
    assert result.returncode != 0
    assert "letsinfer doctor failed on n1, so nothing was changed there" in out, out
    assert "[port 8444] agent plane port 8444 on 0.0.0.0 is taken by python" in out, out
    assert "move the agent plane to another port ([agent] api_port)" in out, out
    for host in ("main", "n1"):  # the doctor ran on the main too, then the run stopped
        left = "/opt/letsinfer /etc/letsinfer /var/lib/letsinfer/authority.db"
        left += " " + " ".join(sorted(made))  # the doctor's own temporary folders are gone too
        assert sh(lab, host, f"for p in {left}; do test -e $p && echo $p; done; true") == ""
        assert lab.ssh(host, "getent passwd letsinfer").returncode == 2
    assert "Nodes | Install" not in result.stdout


def test_an_installed_host_has_the_man_pages_where_man_looks(converged: Lab, site: Site) -> None:
    """The wheel's pages, linked by the node role (the lab's node_man_dir is
    /opt/man/man1: /usr is shared by every lab host), as n1 had them right
    after site.yml."""

    def seen(command: str) -> str:
        return printed(site.man[command])

    # man finds the page by the link (and names the file the link resolves to)
    found = seen("man -M /opt/man -w letsinfer-model-pull")
    assert found == "/opt/letsinfer/releases/0.1.0/share/man/man1/letsinfer-model-pull.1"
    link = "/opt/man/man1/letsinfer-model-pull.1"
    assert seen(f"readlink {link}") == (
        "/opt/letsinfer/current/share/man/man1/letsinfer-model-pull.1"
    )
    assert seen(f"cat {link}") == (
        (ROOT / "docs" / "man" / "letsinfer-model-pull.1").read_text().strip()
    )
    shown = seen("MANWIDTH=100 man -M /opt/man letsinfer-model-pull")
    assert "letsinfer-model-pull - Pull a GGUF model" in shown
    pages = seen("ls /opt/man/man1").split()
    assert sorted(pages) == sorted(p.name for p in (ROOT / "docs" / "man").glob("*.1"))


def test_upgrade_to_a_broken_build_stops_at_the_first_host_and_restores_it(
    converged: Lab, wheels: Path, tmp_path: Path
) -> None:
    lab = converged
    n1_before = node_status(lab, "n1")
    assert n1_before["running"]
    n1_releases = sh(lab, "n1", "ls /opt/letsinfer/releases")  # 0.1.0 (and 0.1.2 after that test)
    main_before = node_status(lab, "main")

    # A release the site's source (node_wheelhouse, as site.yml used) does not
    # hold: it cannot be installed, and nothing else changes (no restart).
    missing = playbook(lab, wheels, "upgrade.yml", "-e", "upgrade_version=0.1.3")
    out = " ".join(missing.stdout.split())
    assert missing.returncode != 0
    assert "Upgrading main from 0.1.0 to 0.1.3 failed at 'Release | Install letsinfer" in out
    # offline, from the wheelhouse, as site.yml installed
    assert "--no-index" in out and "Looking in links: /opt/letsinfer/wheelhouse" in out, out
    assert node_status(lab, "main")["pid"] == main_before["pid"], "the main was never stopped"
    assert sh(lab, "main", "readlink /opt/letsinfer/current") == "/opt/letsinfer/releases/0.1.0"

    broken = wheelhouse.build_variant(tmp_path / "broken", "0.1.1", broken=True)

    result = playbook(
        lab,
        wheels,
        "upgrade.yml",
        "-e",
        "upgrade_version=0.1.1",
        "-e",
        f"upgrade_wheelhouse={broken}",
    )
    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert "Upgrading main from 0.1.0 to 0.1.1 failed" in out
    assert "a deliberately broken build of letsinfer" in out
    assert "Release 0.1.0 is current and healthy again" in out

    # the first host: the broken release was tried, the previous one restored and serving
    assert sh(lab, "main", "readlink /opt/letsinfer/current") == "/opt/letsinfer/releases/0.1.0"
    assert sh(lab, "main", "/opt/letsinfer/current/bin/letsinfer --version").endswith("0.1.0")
    assert sh(lab, "main", "test -d /opt/letsinfer/releases/0.1.1 && echo kept") == "kept"
    assert node_status(lab, "main")["running"]
    assert healthy(lab, "main")

    # the next host was never touched
    n1_releases_after = sh(lab, "n1", "ls /opt/letsinfer/releases")
    assert n1_releases_after == n1_releases and "0.1.1" not in n1_releases_after.split()
    assert node_status(lab, "n1")["pid"] == n1_before["pid"]


def test_upgrade_to_a_good_build_keeps_the_previous_release_and_runs_once(
    converged: Lab, tiny_ready_on_n1: dict[str, object], wheels: Path, tmp_path: Path
) -> None:
    lab = converged
    good = wheelhouse.build_variant(tmp_path / "good", "0.1.2", broken=False)
    # The new release comes from where site.yml took letsinfer: the inventory's
    # node_wheelhouse (the lab's inventory reads it from LETSINFER_LAB_WHEELHOUSE).
    wheels = good
    args = ("--limit", "n1", "-e", "upgrade_version=0.1.2")
    assert node_status(lab, "n1")["role"] == "child"  # enrolled by site.yml: no gateway

    # The tiny model also runs on n1 (main_placements): it serves on through the
    # upgrade, from the very same engine.
    engine = tiny_ready_on_n1
    served_before = served_by(lab, engine["id"])
    key = Path(f"/tmp/letsinfer-lab-{lab.prefix}/api-key").read_text().strip()
    flag = tmp_path / "upgraded"
    url = f"http://{lab.hosts['main'].address}:8000/v1/chat/completions"
    client = subprocess.Popen(
        lab.in_ctl(sys.executable, "-c", CLIENT, url, key, str(flag)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    # as if 0.1.0 had no `model pull`: the upgrade links the page 0.1.2 brings
    sh(lab, "n1", "rm /opt/man/man1/letsinfer-model-pull.1")

    began = time.time() - 1
    first = playbook(lab, wheels, "upgrade.yml", *args)
    flag.touch()
    out, err = client.communicate(timeout=60)
    assert first.returncode == 0, first.stdout
    statuses = json.loads(out)
    assert statuses and set(statuses) == {200}, (statuses, err)
    after = tiny_on(lab, "n1")
    assert after.get("pid") == engine["pid"] and after.get("state") == "ready", after
    assert served_by(lab, engine["id"]) > served_before, "n1's engine served during the upgrade"
    assert sh(lab, "n1", "readlink /opt/letsinfer/current") == "/opt/letsinfer/releases/0.1.2"
    assert sh(lab, "n1", "readlink /opt/letsinfer/previous") == "/opt/letsinfer/releases/0.1.0"
    assert sh(lab, "n1", "/opt/letsinfer/current/bin/letsinfer --version").endswith("0.1.2")
    assert sh(lab, "n1", "man -M /opt/man -w letsinfer-model-pull") == (
        "/opt/letsinfer/releases/0.1.2/share/man/man1/letsinfer-model-pull.1"
    )
    assert active_child(lab, "n1", since=began)  # it rejoined the main
    pid = node_status(lab, "n1")["pid"]

    again = playbook(lab, wheels, "upgrade.yml", *args)  # not older any more: nothing to do
    assert again.returncode == 0, again.stdout
    assert re.search(r"n1\s+: ok=\d+\s+changed=0\s", again.stdout), again.stdout
    assert node_status(lab, "n1")["pid"] == pid


def test_wipe_needs_the_host_name_then_removes_everything_but_models(
    converged: Lab, tiny_ready_on_n1: dict[str, object], site: Site, wheels: Path
) -> None:
    lab = converged
    site.converged = False  # a test after this one runs site.yml again
    other = "table inet othertool {\n chain c {\n  type filter hook input priority 5;\n }\n}\n"
    sh(lab, "n1", f"printf '{other}' | nft -f -")  # another tool's table must survive
    models = sh(lab, "n1", "find /var/lib/letsinfer/models -type f | sort")
    assert models  # the node's store holds the tiny model
    # a member `node add --ssh` admitted (roles/firewall/tasks/member.yml writes these)
    members = "/etc/nftables.d/letsinfer.members.d"
    sh(lab, "n1", f"mkdir -p {members} && echo '# n9' > {members}/n9.nft")
    before = node_status(lab, "n1")

    refused = playbook(lab, wheels, "wipe.yml", "--limit", "n1")
    assert refused.returncode != 0
    assert "Not wiping n1: its name was not confirmed" in " ".join(refused.stdout.split())
    assert node_status(lab, "n1")["pid"] == before["pid"]
    assert sh(lab, "n1", "nft list table inet letsinfer | head -1") == "table inet letsinfer {"

    wrong = playbook(lab, wheels, "wipe.yml", "--limit", "n1", "-e", "wipe_confirm=main")
    assert wrong.returncode != 0 and node_status(lab, "n1")["running"]

    done = playbook(lab, wheels, "wipe.yml", "--limit", "n1", "-e", "wipe_confirm=n1")
    assert done.returncode == 0, done.stdout
    assert "except model data" in done.stdout
    gone = f"/opt/letsinfer /etc/letsinfer /run/letsinfer /var/lib/letsinfer/authority.db {members}"
    assert sh(lab, "n1", f"for p in {gone}; do test -e $p && echo $p; done; true") == ""
    assert sh(lab, "n1", "ls /opt/man/man1") == ""  # the man page links went too
    assert lab.ssh("n1", "nft list table inet letsinfer").returncode != 0
    assert lab.ssh("n1", "nft list table inet othertool").returncode == 0
    assert lab.ssh("n1", "getent passwd letsinfer").returncode == 2
    assert letsinfer_processes(lab, "n1") == []
    assert sh(lab, "n1", "find /var/lib/letsinfer/models -type f | sort") == models
    assert healthy(lab, "main")  # the other host still serves

    with_models = playbook(
        lab,
        wheels,
        "wipe.yml",
        "--limit",
        "main",
        "-e",
        "wipe_confirm=main",
        "-e",
        "wipe_models=true",
    )
    assert with_models.returncode == 0, with_models.stdout
    assert sh(lab, "main", "test -e /var/lib/letsinfer && echo left; true") == ""
    assert letsinfer_processes(lab, "main") == []
