"""Onboarding with site.yml under attack, on a four-host lab: the inventory's
main and children n1, n2, and an outsider (a LAN host in no letsinfer group,
not in the inventory) that runs its own letsinfer main.

The story, run once for the module (it is what an operator does):

1. While an outsider watches every letsinfer port it can see listening on the
   members (from its own network namespace), site.yml onboards main and n1.
2. n2 is set up by hand as a candidate (`node init`, `service start`, as the
   README says for a new machine), not yet in the inventory and with no
   firewall. The outsider plants an enrollment request on it, sent by its own
   main named after the real main's address.
   It also sends one forged with the real main's CA and node certificates
   (both public), naming the real main and the latest expiry a candidate
   keeps, but signed by a key of its own.
3. n2 is added to the inventory and site.yml runs again.

Then: n2 is a child of the real main; the planted request was rejected and
audited on n2, the forged one refused as it arrived, each recorded under the
outsider's address; the outsider's main never lists n2; the outsider never reached
the control, agent, engine or metrics ports of a firewalled member (n2's only
before its table was loaded, never after); it reaches the gateway. Needs root,
like CI.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

from tests.lab.netns import Lab, printed, running_lab
from tests.lab.probes import connects, enter_network_namespace, listening_ports, protected

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOSTS = ("main", "n1", "n2", "outsider")
MEMBERS = ("main", "n1", "n2")
LETSINFER = "/opt/letsinfer/current/bin/letsinfer"
T = TypeVar("T")


pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("sshd", "nft", "nc", "nsenter")),
        reason="the lab needs root, openssh-server, nftables, netcat-openbsd and util-linux",
    ),
    pytest.mark.timeout(1200),  # the story: two site.yml runs on a loaded 2-core machine
]


# -- the outsider's view ------------------------------------------------------


def in_namespace(ns: str, work: Callable[[], T]) -> T:
    """``work()`` run by a thread that lives in network namespace ``ns``."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            enter_network_namespace(ns)
            out.append(work())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


@dataclass
class Watch:
    """The outsider, trying every protected port it finds listening on a member,
    round after round from its own network namespace while the plays run."""

    lab: Lab
    phase: str = "before"
    # (round, phase, host, port, reached) for each listening protected port tried
    tries: list[tuple[int, str, str, int, bool]] = field(default_factory=list)
    rounds: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    @property
    def seen(self) -> set[tuple[str, int]]:
        return {(host, port) for _, _, host, port, _ in self.tries}

    @property
    def reached(self) -> list[tuple[str, str, int]]:
        return [(phase, host, port) for _, phase, host, port, ok in self.tries if ok]

    def _round(self, sshd: dict[str, int]) -> None:
        targets = {}
        for host in MEMBERS:
            for port in filter(protected, listening_ports(sshd[host])):
                targets[(self.lab.hosts[host].address, port)] = host
        accepted = connects(list(targets))
        for (address, port), host in targets.items():
            self.tries.append((self.rounds, self.phase, host, port, (address, port) in accepted))
        self.rounds += 1

    def _run(self) -> None:
        try:
            enter_network_namespace(self.lab.hosts["outsider"].namespace)
            sshd = {
                h: int((Path(self.lab.hosts[h].workdir) / "sshd.pid").read_text()) for h in MEMBERS
            }
            while not self._stop.is_set():
                self._round(sshd)
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

    def closed_since(self, host: str) -> int | None:
        """The first round in which a listening protected port of ``host`` refused."""
        return min((r for r, _, h, _, ok in self.tries if h == host and not ok), default=None)

    def violations(self) -> list[tuple[str, str, int]]:
        """Protected ports reached on a member after its table was loaded: main and
        n1 from the first round (site.yml loads it before they listen); n2, set up
        by hand without a firewall, from the round its table first refused."""
        found = []
        for round_, phase, host, port, ok in self.tries:
            since = 0 if host in ("main", "n1") else self.closed_since(host)
            if ok and since is not None and round_ >= since:
                found.append((phase, host, port))
        return found


# -- the lab and the story ------------------------------------------------------


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab(list(HOSTS)) as the_lab:
        yield the_lab


def plain_env() -> dict[str, str]:
    """This environment without letsinfer's own variables (no home leaks in)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LETSINFER_")}


def by_hand_run(
    lab: Lab, host: str, *args: str, home: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`letsinfer ARGS` run by a person on ``host`` with this checkout's
    letsinfer (the default home there, or ``home``)."""
    homed = ["--home", home] if home else []
    argv = lab.hosts[host].nsenter(sys.executable, "-m", "letsinfer", *homed, *args)
    return subprocess.run(argv, capture_output=True, text=True, env=plain_env(), timeout=180)


def by_hand(lab: Lab, host: str, *args: str, home: str | None = None) -> str:
    result = by_hand_run(lab, host, *args, home=home)
    assert result.returncode == 0, f"{host}: letsinfer {' '.join(args)}: {result.stderr}"
    return result.stdout


def on(lab: Lab, host: str, command: str) -> subprocess.CompletedProcess[str]:
    return lab.ssh(host, command, timeout=120)


def sh(lab: Lab, host: str, command: str) -> str:
    return printed(on(lab, host, command))


def one(data: object) -> dict[str, object]:
    """`status --json`: one object (a one-item list in releases before 0.2)."""
    return dict(data[0] if isinstance(data, list) else data)  # type: ignore[arg-type]


def status(lab: Lab, host: str) -> dict[str, object]:
    return one(json.loads(sh(lab, host, f"{LETSINFER} status --json")))


def parsed(result: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a command the story ran printed (it must have succeeded)."""
    return json.loads(printed(result))


def playbook(
    lab: Lab, wheels: Path, name: str, *args: str, inventories: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    inventory = [a for i in ("inventories/lab", *inventories) for a in ("-i", i)]
    return subprocess.run(
        [str(BIN / "ansible-playbook"), *inventory, f"playbooks/{name}", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "LETSINFER_LAB_PREFIX": lab.prefix,
            "LETSINFER_LAB_WHEELHOUSE": str(wheels),
            "ANSIBLE_FORCE_COLOR": "0",
        },
        stdin=subprocess.DEVNULL,
        timeout=900,
    )


def inventory_file(
    lab: Lab, name: str, main: dict[str, object], children: dict[str, object]
) -> str:
    """An inventory (hosts: their variables) with the lab's settings."""
    path = Path(lab.workdir) / "inventories" / name / "hosts.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    groups = {
        group: {"hosts": hosts}
        for group, hosts in (("letsinfer_main", main), ("letsinfer_children", children))
        if hosts
    }
    path.write_text(json.dumps({"letsinfer": {"children": groups}}))  # JSON is YAML
    with contextlib.suppress(FileExistsError):  # the lab's settings, for hosts of any group
        (path.parent / "group_vars").symlink_to(ROOT / "inventories" / "lab" / "group_vars")
    return str(path)


@dataclass
class Story:
    outsider_home: str
    outsider: dict[str, object]  # the outsider main's status
    planted: dict[str, object]  # its `node add --json` answer
    pending_on_n2: list[dict[str, object]]  # n2's `node requests --json` after the plant
    refused_accept: subprocess.CompletedProcess[str]
    requests_after_refusal: list[dict[str, object]]
    forged: list[tuple[dict[str, object], str, str]]  # with the real main's CA; n2's answers
    requests_after_forgery: list[dict[str, object]]
    run1: subprocess.CompletedProcess[str]
    run2: subprocess.CompletedProcess[str]
    watch: Watch
    # read right after run 2 (a later test removes, wipes and enrolls n2 again,
    # and places tiny on it): the members' status, n2's requests and audit, the
    # mains' node lists, where tiny runs
    main_status: subprocess.CompletedProcess[str]
    n2_status: subprocess.CompletedProcess[str]
    n2_requests: subprocess.CompletedProcess[str]
    n2_audit: subprocess.CompletedProcess[str]
    main_nodes: subprocess.CompletedProcess[str]
    outsider_nodes: subprocess.CompletedProcess[str]
    tiny: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def story(lab: Lab, wheels: Path) -> Iterator[Story]:
    outsider = lab.hosts["outsider"]
    home = str(Path(outsider.workdir) / "letsinfer")
    # Its own main, named after the real main's address; its requests expire late
    # (the old accept step took the newest of the requests that "named" the main).
    Path(home, "etc").mkdir(parents=True)
    Path(home, "etc", "config.toml").write_text(
        "[control]\nenrollment_ttl_s = 86400\n[engine]\nthreads = 1\n[gateway]\nmetrics_port = 0\n"
    )
    real_main = lab.hosts["main"].address
    by_hand(lab, "outsider", "node", "init", "--main", "--name", real_main, home=home)
    by_hand(lab, "outsider", "service", "start", "--json", "--timeout", "150", home=home)
    outsider_status = one(json.loads(by_hand(lab, "outsider", "status", "--json", home=home)))

    watch = Watch(lab)
    watch.start()
    try:
        watch.phase = "run 1"
        run1 = playbook(lab, wheels, "site.yml")
        assert run1.returncode == 0, run1.stdout[-6000:]

        # n2, a new machine set up by hand before it is in the inventory
        watch.phase = "n2 by hand"
        by_hand(lab, "n2", "node", "init")
        by_hand(lab, "n2", "service", "start", "--json", "--timeout", "120")
        n2 = lab.hosts["n2"].address
        identity = subprocess.run(
            lab.hosts["outsider"].nsenter(
                "curl", "-sk", "-m", "10", f"https://{n2}:8444/v1/identity"
            ),
            capture_output=True,
            text=True,
        )
        fingerprint = json.loads(identity.stdout)["fingerprint"]
        planted = json.loads(
            by_hand(
                lab,
                "outsider",
                *("node", "add", "--address", f"{n2}:8444", "--fingerprint", fingerprint),
                "--json",
                home=home,
            )
        )
        pending = json.loads(by_hand(lab, "n2", "node", "requests", "--json"))
        # what a careful person on n2 would do: accept only the real main's cluster
        main_ca = str(status(lab, "main")["ca_fingerprint"])
        refused = subprocess.run(
            lab.hosts["n2"].nsenter(
                sys.executable,
                *("-m", "letsinfer", "node", "accept", str(planted["id"])),
                *("--ca-fingerprint", f"sha256:{main_ca.upper()}"),
            ),
            capture_output=True,
            text=True,
            env=plain_env(),
            timeout=120,
        )
        after_refusal = json.loads(by_hand(lab, "n2", "node", "requests", "--json"))
        forged = forge_requests(lab, main_ca)
        after_forgery = json.loads(by_hand(lab, "n2", "node", "requests", "--json"))

        watch.phase = "run 2"
        # the lab inventory has main and n1; this one adds n2 to the children
        n2_added = inventory_file(lab, "n2", {}, {"n2": {"ansible_host": n2}})
        run2 = playbook(lab, wheels, "site.yml", inventories=(n2_added,))
        watch.phase = "after"
        time.sleep(3)  # a few more rounds of the watch on the finished site
    finally:
        watch.stop()
    yield Story(
        home,
        outsider_status,
        planted,
        pending,
        refused,
        after_refusal,
        forged,
        after_forgery,
        run1,
        run2,
        watch,
        main_status=on(lab, "main", f"{LETSINFER} status --json"),
        n2_status=on(lab, "n2", f"{LETSINFER} status --json"),
        n2_requests=on(lab, "n2", f"{LETSINFER} node requests --json"),
        n2_audit=on(lab, "n2", f"{LETSINFER} audit list --json"),
        main_nodes=on(lab, "main", f"{LETSINFER} node list --json"),
        outsider_nodes=by_hand_run(lab, "outsider", "node", "list", "--json", home=home),
        tiny=on(lab, "main", f"{LETSINFER} model show tiny --json"),
    )


def forge_requests(lab: Lab, main_ca: str) -> list[tuple[dict[str, object], str, str]]:
    """The outsider sends n2 enrollment requests with the real main's CA
    certificate (public: any member presents it), the real main's id, name and
    address, and the latest expiry a candidate keeps (a week): one as an old
    release's main would send it, and one that also carries the real main's
    node certificate (public too) with a signature by a key of the outsider's
    own, since the main's key is what it cannot have. Each with n2's HTTP
    status and answer."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    pki_dir = f"/etc/letsinfer/clusters/{main_ca[:16]}"
    ca_pem = sh(lab, "main", f"cat {pki_dir}/ca.crt") + "\n"
    main_cert = sh(lab, "main", f"cat {pki_dir}/node.crt") + "\n"
    main = status(lab, "main")
    plain = {
        "enrollment_id": "enr-forged000001",
        "main_id": str(main["node_id"]),
        "main_name": str(main["name"]),
        "main_address": f"{lab.hosts['main'].address}:8443",
        "ca": ca_pem,
        "token": "f" * 43,
        "expires_at": time.time() + 7 * 86400,
        "gateway_url": None,
    }
    signed = {**plain, "enrollment_id": "enr-forged000002", "main_cert": main_cert}
    own_key = ec.generate_private_key(ec.SECP256R1())
    signature = own_key.sign(json.dumps(signed, sort_keys=True).encode(), ec.ECDSA(hashes.SHA256()))
    signed["signature"] = base64.b64encode(signature).decode()
    out = []
    for n, forged in enumerate((plain, signed)):
        body = Path(lab.hosts["outsider"].workdir) / f"forged{n}.json"
        body.write_text(json.dumps(forged))
        answer = subprocess.run(
            lab.hosts["outsider"].nsenter(
                *("curl", "-sk", "-m", "10", "-w", "\n%{http_code}"),
                *("-H", "content-type: application/json", "--data-binary", f"@{body}"),
                f"https://{lab.hosts['n2'].address}:8444/v1/enroll/request",
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        text, _, code = answer.stdout.rpartition("\n")
        out.append((forged, code, text))
    return out


# -- what the operator and the attacker see --------------------------------------


def test_site_yml_enrolls_the_child_with_the_real_main_and_rejects_the_planted_request(
    lab: Lab, story: Story
) -> None:
    main = one(parsed(story.main_status))
    planted_id = str(story.planted["id"])
    # the request as n2 saw it: the outsider's own words, and the one thing it cannot forge
    [seen] = [r for r in story.pending_on_n2 if r["id"] == planted_id]
    assert seen["main"] == lab.hosts["main"].address  # a name that proves nothing
    assert seen["main_address"] == f"{lab.hosts['outsider'].address}:8443"
    assert seen["ca_fingerprint"] == story.outsider["ca_fingerprint"] != main["ca_fingerprint"]
    assert seen["main_id"] == story.outsider["node_id"]

    # `node accept --ca-fingerprint` with the real main's: refused, nothing changed
    refused = story.refused_accept
    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert f"comes from the cluster whose CA fingerprint is sha256:{seen['ca_fingerprint']}" in said
    assert f"not sha256:{main['ca_fingerprint']}: not accepted, nothing changed" in said
    assert story.requests_after_refusal == story.pending_on_n2

    # site.yml: n2 joined the real main's cluster, never the outsider's
    n2 = one(parsed(story.n2_status))
    theirs = parsed(story.outsider_nodes)
    assert [n["name"] for n in theirs] == [lab.hosts["main"].address], "n2 joined the outsider"
    assert n2["role"] == "child"
    assert n2["ca_fingerprint"] == main["ca_fingerprint"], (n2, story.run2.stdout[-3000:])
    assert n2["main"] == f"{lab.hosts['main'].address}:8443"
    assert story.run2.returncode == 0, story.run2.stdout[-6000:]
    listed = parsed(story.main_nodes)
    assert {n["name"]: n["state"] for n in listed}.get("n2") == "active"

    # the planted request: gone, and n2's audit says who rejected what, and why not accepted
    assert parsed(story.n2_requests) == []
    audit = parsed(story.n2_audit)
    rejected = [r for r in audit if r["action"] == "node.reject"]
    assert len(rejected) == 1 and planted_id in str(rejected[0]["detail"]), rejected
    assert f"sha256:{seen['ca_fingerprint']}" in str(rejected[0]["detail"])
    denied = [r for r in audit if r["action"] == "node.accept" and r["outcome"] == "denied"]
    assert len(denied) == 1 and planted_id in str(denied[0]["detail"]), denied
    accepted = [r for r in audit if r["action"] == "node.accept" and r["outcome"] == "ok"]
    assert [r["detail"] for r in accepted] == [f"cluster sha256:{main['ca_fingerprint']}"]


def test_a_request_forged_with_the_real_main_s_ca_never_takes_the_main_s_place(
    lab: Lab, story: Story
) -> None:
    """The CA certificate is public and a request names its own expiry: a request
    that does not prove the main's key is refused as it arrives, touches nothing
    n2 kept, and site.yml enrolls n2 with the real main on the first run. n2's
    audit names the address each request came from, not the one it claims."""
    outsider, real_main = lab.hosts["outsider"].address, lab.hosts["main"].address
    main = one(parsed(story.main_status))
    for forged, code, answer in story.forged:
        assert forged["ca"] and forged["main_address"] == f"{real_main}:8443"
        assert code == "403", (forged["enrollment_id"], code, answer)
        assert "does not prove the key of the main it names" in answer, answer
    assert story.requests_after_forgery == story.requests_after_refusal  # nothing kept, none gone

    assert story.run2.returncode == 0, story.run2.stdout[-6000:]
    n2 = one(parsed(story.n2_status))
    assert n2["role"] == "child" and n2["ca_fingerprint"] == main["ca_fingerprint"]

    audit = parsed(story.n2_audit)
    asked = [r for r in audit if r["action"] == "node.enroll.request"]
    refused = [r for r in asked if r["outcome"] == "denied"]
    assert refused and {r["actor"] for r in refused} == {f"anonymous:{outsider}"}, refused
    assert all("does not prove the key" in str(r["detail"]) for r in refused), refused
    kept = [str(r["detail"]) for r in asked if r["outcome"] == "ok"]
    planted = f"{story.planted['id']} from {outsider}, cluster CA sha256:"
    assert [d for d in kept if d.startswith(planted)] == [
        planted + str(story.outsider["ca_fingerprint"])
    ], kept
    real = [
        d
        for d in kept
        if d.endswith(f"from {real_main}, cluster CA sha256:{main['ca_fingerprint']}")
    ]
    assert len(real) == 1 and not any("forged" in d for d in kept), kept


def test_no_moment_of_onboarding_opens_a_member_s_planes_to_the_outsider(
    lab: Lab, story: Story
) -> None:
    watch = story.watch
    assert watch.violations() == [], f"the outsider reached: {sorted(set(watch.violations()))}"
    assert watch.closed_since("n2") is not None  # its hand-started candidate, closed by run 2

    # the watch saw what it was meant to watch, engines included
    show = parsed(story.tiny)
    engines = [
        (pg["node"], urlsplit(pg["endpoint"]).port)
        for pg in show["placement_groups"]
        if pg["node"] != "main" and pg["endpoint"]
    ]
    assert engines and all(node == "n1" for node, _ in engines), show
    expected = {("main", 8443), ("main", 8444), ("main", 9400), ("n1", 8444), ("n2", 8444)}
    assert expected | set(engines) <= watch.seen, watch.seen
    assert ("n2", 8444) in {(h, p) for _, h, p in watch.reached}, "open before its table"

    # and after the run: nothing but the gateway
    targets = [(lab.hosts[h].address, p) for h, p in sorted(expected | set(engines))]
    gateway = (lab.hosts["main"].address, 8000)
    outsider_ns = lab.hosts["outsider"].namespace
    assert in_namespace(outsider_ns, lambda: connects([*targets, gateway])) == {gateway}
    health = subprocess.run(
        [
            *("ip", "netns", "exec", outsider_ns, "curl", "-s", "-m", "10"),
            *("-o", "/dev/null", "-w", "%{http_code}"),
            f"http://{lab.hosts['main'].address}:8000/health",
        ],
        capture_output=True,
        text=True,
    )
    assert health.stdout == "200"


def test_the_member_set_follows_the_inventory_on_every_run(lab: Lab, story: Story) -> None:
    for host in ("main", "n1", "n2"):
        members = sh(lab, host, "nft list set inet letsinfer members_v4")
        for member in MEMBERS:
            assert lab.hosts[member].address in members, (host, members)
        assert lab.hosts["outsider"].address not in members
        rules = sh(lab, host, "nft list chain inet letsinfer input")
        assert re.search(r"tcp dport 9400 drop", rules), rules


def test_opting_out_of_the_firewall_removes_the_table_loudly(
    lab: Lab, wheels: Path, story: Story
) -> None:
    """firewall_enabled=false leaves no letsinfer table behind: the outsider then
    reaches n1's agent port, as the warning says; the next run with the
    firewall on closes it again."""
    n1_agent = (lab.hosts["n1"].address, 8444)
    outsider_ns = lab.hosts["outsider"].namespace
    assert in_namespace(outsider_ns, lambda: connects([n1_agent])) == set()
    n2_added = inventory_file(lab, "n2", {}, {"n2": {"ansible_host": lab.hosts["n2"].address}})
    try:
        result = playbook(
            lab,
            wheels,
            "firewall.yml",
            *("--limit", "n1", "-e", "firewall_enabled=false"),
            inventories=(n2_added,),
        )
        assert result.returncode == 0, result.stdout
        # what the warning says is what the host has: the outsider reaches its agent
        assert in_namespace(outsider_ns, lambda: connects([n1_agent])) == {n1_agent}
        assert on(lab, "n1", "nft list table inet letsinfer").returncode != 0
        assert on(lab, "n1", "test -e /etc/nftables.d/letsinfer.nft").returncode != 0
        out = " ".join((result.stdout + result.stderr).split())  # Ansible warns on stderr
        assert "[WARNING]: firewall_enabled is false: n1 gets no letsinfer firewall table" in out
        assert "reachable from any host that can reach it, members or not" in out
        assert "the nftables table inet letsinfer that an earlier run loaded on n1 is deleted" in (
            out
        )
    finally:  # the firewall back on n1, for the tests after this one
        again = playbook(lab, wheels, "firewall.yml", "--limit", "n1", inventories=(n2_added,))
    assert again.returncode == 0, again.stdout
    assert in_namespace(outsider_ns, lambda: connects([n1_agent])) == set()


def site_alone(lab: Lab, inventory: str, *args: str) -> subprocess.CompletedProcess[str]:
    """site.yml with only ``inventory`` (and the lab's settings)."""
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", inventory, "playbooks/site.yml", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "LETSINFER_LAB_PREFIX": lab.prefix, "ANSIBLE_FORCE_COLOR": "0"},
        timeout=300,
    )


def _node_files(lab: Lab, hosts: tuple[str, ...]) -> dict[str, str]:
    return {
        h: sh(lab, h, "cat /etc/letsinfer/node.json; nft list ruleset | sha256sum") for h in hosts
    }


def test_a_host_whose_node_is_not_the_inventory_s_is_refused_before_anything_changes(
    lab: Lab, wheels: Path, story: Story
) -> None:
    main, n1, outsider = (lab.hosts[h].address for h in ("main", "n1", "outsider"))
    before = _node_files(lab, ("main", "n1"))

    # main and n1 swapped: a main where the inventory puts a child, and the other way round
    swapped = inventory_file(
        lab, "swapped", {"n1": {"ansible_host": n1}}, {"main": {"ansible_host": main}}
    )
    result = site_alone(lab, swapped)
    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert "main already holds a letsinfer main named 'main'" in out
    assert "but the inventory makes main a child" in out
    assert "n1 already holds a letsinfer child named 'n1'" in out
    assert "but the inventory makes n1 the main" in out
    assert "playbooks/wipe.yml --limit main -e wipe_confirm=main" in out
    assert "Nothing was changed on any host" in out
    assert "Firewall |" not in out and "Install |" not in out

    # the outsider's main taken for the inventory's main: a main this inventory did
    # not make, and n1 a child of another cluster than that one
    strange = inventory_file(
        lab,
        "strange",
        {"outsider": {"ansible_host": outsider, "node_home": story.outsider_home}},
        {"n1": {"ansible_host": n1}},
    )
    result = site_alone(lab, strange)
    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert f"outsider already holds a letsinfer main named '{main}'" in out
    assert "which this inventory did not make (it names its main 'outsider')" in out
    assert (
        "a child of another cluster than the inventory's "
        f"(CA sha256:{story.outsider['ca_fingerprint']})"
    ) in out
    assert "Firewall |" not in out

    # the same with the main outside the play (--limit): read from the main host
    limited = site_alone(lab, strange, "--limit", "n1")
    out = " ".join(limited.stdout.split())
    assert limited.returncode != 0
    assert (
        "n1 already holds a letsinfer child named 'n1' (node id "
        f"{status(lab, 'n1')['node_id']}, cluster CA sha256:"
    ) in out
    assert f"than the inventory's (CA sha256:{story.outsider['ca_fingerprint']})" in out
    assert _node_files(lab, ("main", "n1")) == before
    assert lab.ssh("outsider", "nft list table inet letsinfer").returncode != 0


# -- the lab itself ------------------------------------------------------------

_MACHINE_WITH_A_NODE = """
import json, subprocess, sys
from pathlib import Path
from tests.lab.netns import lab_up

root = Path(sys.argv[1])
# This mount namespace is a machine that runs its own node (as after `./dev up`):
# letsinfer's paths exist under /etc, /var/lib and /opt, not touching the real ones.
subprocess.run(["mount", "-t", "tmpfs", "machine", str(root)], check=True)
for d in ("etc", "var/lib", "opt"):
    (root / "upper" / d / "letsinfer").mkdir(parents=True)
    (root / "upper" / d / "letsinfer" / "node.json").write_text('{"role": "main"}')
    (root / "work" / d).mkdir(parents=True)
    options = f"lowerdir=/{d},upperdir={root}/upper/{d},workdir={root}/work/{d}"
    subprocess.run(["mount", "-t", "overlay", "machine", "-o", options, f"/{d}"], check=True)
assert Path("/etc/letsinfer/node.json").exists()
lab = lab_up(["h1"], root / "lab")
try:
    seen = {}
    for p in ("/etc/letsinfer", "/var/lib/letsinfer", "/opt/letsinfer", "/run/letsinfer"):
        # empty, and the host can make it its own
        ls = f"ls -A {p} 2>/dev/null; mkdir -p {p}/own && ls -A {p}"
        run = subprocess.run(lab.hosts["h1"].nsenter("sh", "-c", ls), capture_output=True)
        seen[p] = run.stdout.decode().split()
    print(json.dumps(seen))
finally:
    lab.down()
"""


def test_a_removed_and_wiped_child_comes_back_under_its_name_serving(
    lab: Lab, wheels: Path, story: Story
) -> None:
    """`node remove`, then wipe.yml, then site.yml: the host is enrolled again
    under its name with a new identity; the old one stays removed and revoked."""

    def nodes(*args: str) -> dict[str, dict[str, object]]:
        listed = json.loads(sh(lab, "main", f"{LETSINFER} node list --json {' '.join(args)}"))
        return {f"{n['name']}/{n['id']}": n for n in listed}

    [old] = [n for n in nodes().values() if n["name"] == "n2"]
    sh(lab, "main", f"{LETSINFER} node remove n2")
    assert not any(n["name"] == "n2" for n in nodes().values())
    n2_added = inventory_file(lab, "n2", {}, {"n2": {"ansible_host": lab.hosts["n2"].address}})
    wiped = playbook(
        lab, wheels, "wipe.yml", "--limit", "n2", "-e", "wipe_confirm=n2", inventories=(n2_added,)
    )
    assert wiped.returncode == 0, wiped.stdout[-4000:]
    assert on(lab, "n2", "test -e /etc/letsinfer/node.json").returncode != 0

    again = playbook(lab, wheels, "site.yml", inventories=(n2_added,))
    assert again.returncode == 0, again.stdout[-6000:]
    [back] = [n for n in nodes().values() if n["name"] == "n2"]
    assert back["state"] == "active" and back["id"] != old["id"]
    assert back["fingerprint"] != old["fingerprint"]
    removed = nodes("--all")[f"n2/{old['id']}"]
    assert removed["state"] == "removed"

    # And it serves: a model placed on it answers through the main's gateway.
    sh(lab, "main", f"{LETSINFER} model install tiny --node n2 --target cpu --yes")
    key = Path(lab.workdir, "api-key").read_text().strip()
    deadline = time.monotonic() + 120
    while True:
        show = json.loads(sh(lab, "main", f"{LETSINFER} model show tiny --json"))
        groups = {g["node"]: g for g in one(show)["placement_groups"]}  # type: ignore[union-attr]
        if groups.get("n2", {}).get("state") == "ready":
            break
        assert time.monotonic() < deadline, groups
        time.sleep(1)
    # Only n2 admits while the others pause: every answer is n2's.
    for other in ("main", "n1"):
        sh(lab, "main", f"{LETSINFER} node pause {other}")
    try:
        for _ in range(2):
            reply = sh(
                lab,
                "n1",
                "curl -s -D - -o /dev/null http://{main}:8000/v1/chat/completions "
                "-H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' "
                '-d \'{{"model": "tiny", "messages": [{{"role": "user", '
                '"content": "hi"}}]}}\''.format(main=lab.hosts["main"].address, key=key),
            )
            assert reply.startswith("HTTP/1.1 200"), reply
    finally:
        for other in ("main", "n1"):
            sh(lab, "main", f"{LETSINFER} node resume {other}")
    deadline = time.monotonic() + 30
    while True:  # records reach their store in batches
        records = json.loads(sh(lab, "main", f"{LETSINFER} usage --by node --json"))
        if any(r.get("node") == "n2" and int(r["requests"]) >= 2 for r in records):
            break
        assert time.monotonic() < deadline, records
        time.sleep(1)


def test_lab_hosts_never_see_the_machine_s_own_node(tmp_path: Path) -> None:
    """A node the machine itself runs (its /etc/letsinfer, /var/lib/letsinfer,
    /opt/letsinfer) never shows through on a lab host, so `./dev up` then the lab
    tests work; simulated in a private mount namespace, the real paths untouched."""
    root = tmp_path / "machine"
    root.mkdir()
    result = subprocess.run(
        [
            *("unshare", "--mount", "--propagation", "private"),
            *(sys.executable, "-c", _MACHINE_WITH_A_NODE, str(root)),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {
        p: ["own"]
        for p in ("/etc/letsinfer", "/var/lib/letsinfer", "/opt/letsinfer", "/run/letsinfer")
    }
