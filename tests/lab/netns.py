"""Hosts as network namespaces, each with its own sshd and filesystem view.

Layout of one lab (prefix ``P``, a fresh name per run so two runs never collide):

- ``Pbr``: a namespace holding the bridge ``br0``; nothing is added to the
  machine's own network;
- ``P<host>``: one namespace per host, its ``eth0`` a veth peer on that bridge,
  an address from ``SUBNET`` (private, used only inside these namespaces), its
  own sshd (key login only, ``UsePAM no``, ``internal-sftp``) started inside a
  new mount and UTS namespace with overlayfs over ``/etc``, ``/var/lib``,
  ``/opt`` and ``/root`` (their upper layers on a tmpfs private to that
  namespace: what Ansible leaves in ``~/.ansible`` stays on the host) and a
  tmpfs on ``/run``, so the machine's real files are untouched. letsinfer's
  own paths start empty on every host: whiteouts hide ``/etc/letsinfer``,
  ``/var/lib/letsinfer`` and ``/opt/letsinfer`` of the machine (a node it runs
  itself, as after ``./dev up``, never shows through);
- ``Pctl``: the controller's hop (no sshd): Ansible on the root namespace
  reaches hosts with ``ProxyCommand="ip netns exec Pctl nc %h %p"``. It is not
  a cluster member, so it is also the "outsider" that firewall checks use.

Teardown kills every process in each namespace (by the namespace's inode,
like ``ip netns pids``), removes the namespaces and the lab directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyroute2 import IPRoute, netns

SUBNET = "10.77.0"  # /24, exists only inside the lab's namespaces
PREFIX_LEN = 24
CTL_OCTET = 2
FIRST_HOST_OCTET = 11
OVERLAID = ("etc", "var/lib", "opt", "root")
# Hidden from the lower layer (the machine's own): letsinfer's paths, so every
# host starts without a node (/run is a fresh tmpfs anyway), and root's
# .bashrc, which on this machine starts pyenv (about a hundred processes, 0.2 s)
# for every SSH command Ansible runs; a freshly installed host has no such thing.
HIDDEN = ("etc/letsinfer", "var/lib/letsinfer", "opt/letsinfer", "root/.bashrc")
# Ansible's SSH arguments for the lab (ANSIBLE_SSH_ARGS): its default's
# connection sharing without its -C. A playbook run copies the 76 MB
# wheelhouse, compressed wheels, to each host; zlib over a link inside one
# machine only slows that copy (site.yml's unpack step: 13 s with -C, 4 s without).
ANSIBLE_SSH_ARGS = "-o ControlMaster=auto -o ControlPersist=60s"


@dataclass(frozen=True)
class LabHost:
    name: str
    namespace: str
    address: str
    workdir: str

    def nsenter(self, *argv: str) -> list[str]:
        """A command line that runs ``argv`` inside this host (net, mount and UTS)."""
        pid = _sshd_pid(Path(self.workdir))
        return ["nsenter", "-t", str(pid), "-n", "-m", "-u", "--", *argv]


@dataclass
class Lab:
    prefix: str
    workdir: str
    key: str
    bridge_ns: str
    ctl_ns: str
    ctl_address: str
    hosts: dict[str, LabHost] = field(default_factory=dict)

    # -- how to reach it -------------------------------------------------
    @property
    def proxy_command(self) -> str:
        return f"ip netns exec {self.ctl_ns} nc %h %p"

    @property
    def ssh_common_args(self) -> str:
        return (
            f"-o ProxyCommand='{self.proxy_command}' -o StrictHostKeyChecking=no "
            "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
        )

    def env(self) -> dict[str, str]:
        """What inventories/lab reads from the environment."""
        return {
            "LETSINFER_LAB_PREFIX": self.prefix,
            "LETSINFER_LAB_KEY": self.key,
            "LETSINFER_LAB_SSH_ARGS": self.ssh_common_args,
        }

    def in_ctl(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ctl_ns, *argv]

    def ssh(self, host: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "ssh",
                "-i",
                self.key,
                "-o",
                f"ProxyCommand={self.proxy_command}",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "BatchMode=yes",
                f"root@{self.hosts[host].address}",
                command,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def molecule_instances(self) -> list[dict[str, object]]:
        """molecule's instance_config.yml for the delegated driver (JSON is YAML)."""
        return [
            {
                "instance": h.name,
                "address": h.address,
                "user": "root",
                "port": 22,
                "identity_file": self.key,
            }
            for h in self.hosts.values()
        ]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> Lab:
        data = json.loads(path.read_text())
        hosts = {k: LabHost(**v) for k, v in data.pop("hosts").items()}
        return cls(**data, hosts=hosts)

    def wait_for_ssh(self, timeout: float = 60) -> None:
        """Every host answers over SSH, each within ``timeout`` (a loaded
        machine may take seconds to accept a first login)."""
        for name in self.hosts:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    result = self.ssh(name, "true", timeout=15)
                except subprocess.TimeoutExpired:
                    why = "no answer within 15 s"
                else:
                    if result.returncode == 0:
                        break
                    why = result.stderr.strip()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"lab host {name}: no SSH: {why}")
                time.sleep(0.2)

    def down(self) -> None:
        namespaces = [*(h.namespace for h in self.hosts.values()), self.ctl_ns, self.bridge_ns]
        for ns in namespaces:
            kill_namespace(ns)
        for ns in namespaces:
            with contextlib.suppress(FileNotFoundError, OSError):
                netns.remove(ns)
        shutil.rmtree(self.workdir, ignore_errors=True)


def printed(result: subprocess.CompletedProcess[str]) -> str:
    """What a command run on a lab host (``Lab.ssh``) printed; it must have
    succeeded (the failure names the host, the command and its stderr)."""
    assert result.returncode == 0, f"{' '.join(result.args[-2:])}: {result.stderr}"
    return result.stdout.strip()


def new_prefix() -> str:
    return "li" + secrets.token_hex(3)


def namespace_pids(ns: str) -> list[int]:
    """Processes whose network namespace is ``ns`` (what ``ip netns pids`` prints)."""
    try:
        inode = os.stat(f"/run/netns/{ns}").st_ino
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def kill_namespace(ns: str) -> None:
    for _ in range(50):
        pids = namespace_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _sshd_pid(workdir: Path) -> int:
    return int((workdir / "sshd.pid").read_text().strip())


_SSHD_CONFIG = """\
ListenAddress {address}
Port 22
HostKey {workdir}/ssh_host_ed25519_key
PidFile {workdir}/sshd.pid
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
Subsystem sftp internal-sftp
"""

_HOST_INIT = """\
set -eu
# the host's own files live in a tmpfs that exists only in its mount namespace:
# gone, instantly, when its last process is killed
mkdir -p "{workdir}/fs"
mount -t tmpfs -o mode=0755 "lab-{name}-fs" "{workdir}/fs"
for d in {overlaid}; do
  mkdir -p "{workdir}/fs/upper/$d" "{workdir}/fs/work/$d"
done
# a whiteout (a 0/0 character device in the upper layer) hides what the
# machine has there; letsinfer creates its own directories above it
for p in {hidden}; do
  mknod "{workdir}/fs/upper/$p" c 0 0
done
for d in {overlaid}; do
  mount -t overlay "lab-{name}" \
    -o "lowerdir=/$d,upperdir={workdir}/fs/upper/$d,workdir={workdir}/fs/work/$d" "/$d"
done
mount -t tmpfs -o mode=0755 "lab-{name}-run" /run
mkdir -p /run/sshd
hostname "{name}"
exec /usr/sbin/sshd -f "{workdir}/sshd_config" -E "{workdir}/sshd.log"
"""


def _run(argv: Sequence[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def lab_up(hosts: Sequence[str], workdir: Path, prefix: str | None = None) -> Lab:
    """Build a lab; on any failure it is torn down again before the error is raised."""
    prefix = prefix or new_prefix()
    workdir = workdir.absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    key = workdir / "id_ed25519"
    lab = Lab(
        prefix=prefix,
        workdir=str(workdir),
        key=str(key),
        bridge_ns=f"{prefix}br",
        ctl_ns=f"{prefix}ctl",
        ctl_address=f"{SUBNET}.{CTL_OCTET}",
    )
    try:
        _build(lab, list(hosts))
    except BaseException:
        lab.down()
        raise
    return lab


def build_network(bridge_ns: str, members: Sequence[tuple[str, str]]) -> None:
    """Namespaces, each with an ``eth0`` (address/24) on a bridge that lives in a
    namespace of its own: nothing is added to the machine's network. Multicast
    is routed to ``eth0`` so mDNS works across the bridge."""
    netns.create(bridge_ns)
    with IPRoute(netns=bridge_ns) as br:
        br.link("add", ifname="br0", kind="bridge")
        br_idx = br.link_lookup(ifname="br0")[0]
        br.link("set", index=br_idx, state="up")
        for i, (ns, address) in enumerate(members):
            netns.create(ns)
            outer, inner = f"v{i}", f"p{i}"
            br.link("add", ifname=outer, kind="veth", peer={"ifname": inner})
            idx = br.link_lookup(ifname=outer)[0]
            br.link("set", index=idx, master=br_idx, state="up")
            peer = br.link_lookup(ifname=inner)[0]
            br.link("set", index=peer, net_ns_fd=ns)
            with IPRoute(netns=ns) as host:
                pidx = host.link_lookup(ifname=inner)[0]
                host.link("set", index=pidx, ifname="eth0")
                host.addr("add", index=pidx, address=address, prefixlen=PREFIX_LEN)
                host.link("set", index=pidx, state="up")
                lo = host.link_lookup(ifname="lo")[0]
                host.link("set", index=lo, state="up")
                host.route("add", dst="224.0.0.0/4", oif=pidx)


def _build(lab: Lab, hosts: list[str]) -> None:
    workdir = Path(lab.workdir)
    for name in hosts:
        if not name.isidentifier() or len(name) > 12:
            raise ValueError(f"lab host name {name!r}: use letters, digits, _ (12 at most)")
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", lab.key])
    authorized = workdir / "authorized_keys"
    shutil.copyfile(lab.key + ".pub", authorized)

    members = [(lab.ctl_ns, lab.ctl_address)]
    for i, name in enumerate(hosts):
        ns = f"{lab.prefix}{name}"
        address = f"{SUBNET}.{FIRST_HOST_OCTET + i}"
        lab.hosts[name] = LabHost(
            name=name, namespace=ns, address=address, workdir=str(workdir / name)
        )
        members.append((ns, address))
    build_network(lab.bridge_ns, members)

    for host in lab.hosts.values():
        hdir = Path(host.workdir)
        hdir.mkdir(parents=True, exist_ok=True)
        _run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-f",
                str(hdir / "ssh_host_ed25519_key"),
            ]
        )
        (hdir / "sshd_config").write_text(
            _SSHD_CONFIG.format(address=host.address, workdir=hdir, authorized_keys=authorized)
        )
        script = _HOST_INIT.format(
            overlaid=" ".join(OVERLAID), hidden=" ".join(HIDDEN), workdir=hdir, name=host.name
        )
        _run(
            [
                "ip", "netns", "exec", host.namespace,
                "unshare", "--mount", "--uts", "--propagation", "private",
                "sh", "-c", script,
            ]
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not (hdir / "sshd.pid").exists():
            if time.monotonic() > deadline:
                log = (hdir / "sshd.log").read_text() if (hdir / "sshd.log").exists() else ""
                raise RuntimeError(f"lab host {host.name}: sshd did not start: {log}")
            time.sleep(0.02)


@contextlib.contextmanager
def running_lab(hosts: Sequence[str], workdir: Path | None = None) -> Iterator[Lab]:
    """A lab of ``hosts`` with sshd answering, torn down afterwards."""
    prefix = new_prefix()
    lab = lab_up(hosts, workdir or Path(f"/tmp/letsinfer-lab-{prefix}"), prefix)
    try:
        lab.wait_for_ssh()
        yield lab
    finally:
        lab.down()


def port_open(lab: Lab, address: str, port: int, from_host: str | None = None) -> bool:
    """Whether a TCP connection to address:port succeeds from the controller or a host."""
    argv = ["nc", "-z", "-w", "2", address, str(port)]
    cmd = lab.hosts[from_host].nsenter(*argv) if from_host else lab.in_ctl(*argv)
    return subprocess.run(cmd, capture_output=True).returncode == 0
