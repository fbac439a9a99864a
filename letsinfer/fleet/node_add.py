"""``letsinfer node add --ssh``: one machine onboarded from the main with the
collection's own roles (``playbooks/node_add.yml``, site.yml's steps in its
order), run through ansible-runner for that one host.

This module writes the inventory that playbook reads: the main is this
machine (local connection), the new host its only child, reached with the
SSH settings ``ssh_reach.check`` has just proved; the cluster's other
children are its peers, reached the same way, so their firewall tables admit
the new member (their addresses are also the members the new host's table
admits).
"""

from __future__ import annotations

import json
import re
import shlex
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from letsinfer.fleet.apply import ApplyResult, Progress, apply
from letsinfer.fleet.ssh_reach import SshTarget

PLAYBOOK = "node_add.yml"
# validate_inventory's pattern for a host's name (the node's name too)
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Peer:
    """Another child of the cluster, as the authority knows it."""

    name: str
    address: str


@dataclass(frozen=True)
class MainSide:
    """What the playbook needs of the main it runs on."""

    name: str
    address: str  # where the new host reaches the main
    executable: str  # this machine's `letsinfer`
    python: str  # the interpreter Ansible runs modules with here
    home: str  # "" for the default places, else the directory holding etc/var/run
    ca_fingerprint: str  # enrollment and the identity check are bound to it
    peers: Sequence[Peer] = ()  # the cluster's other children
    gateway_port: int = 8000
    control_port: int = 8443
    agent_port: int = 8444


@dataclass(frozen=True)
class Sources:
    """Where the new host installs letsinfer from: a wheelhouse archive on the
    main, else an index (pip's default when ``index_url`` is None)."""

    version: str
    wheelhouse: Path | None = None
    index_url: str | None = None


@dataclass(frozen=True)
class NewHost:
    name: str
    ssh: SshTarget
    become: bool = False
    extra_vars: Mapping[str, Any] = field(default_factory=dict)


def mirror_wheelhouse(bundles: Path, version: str) -> Path | None:
    """The newest bundle imported into the main's mirror whose wheelhouse holds
    this letsinfer ``version``: an air-gapped site's source when no
    --wheelhouse or --index-url is given (the same wheels site.yml installs)."""
    found = [
        wheelhouse
        for wheelhouse in bundles.glob("*/wheelhouse")
        if any(wheelhouse.glob(f"letsinfer-{version}-*.whl"))
    ]
    return max(found, key=lambda w: w.stat().st_mtime, default=None)


def packed(wheelhouse: Path, into: Path) -> Path:
    """``wheelhouse`` (a folder: wheels and their signed list) as the flat tar
    archive the node role installs from."""
    archive = into / "wheelhouse.tar"
    with tarfile.open(archive, "w") as tar:
        for item in sorted(wheelhouse.iterdir()):
            if item.is_file():
                tar.add(item, arcname=item.name)
    return archive


def node_name(host: str) -> str:
    """The default node name for HOST: its first label, lower case."""
    if _is_address(host):
        return host.replace(".", "-").replace(":", "-").strip("-").lower()
    return host.split(".")[0].lower()


def _is_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def inventory(main: MainSide, new: NewHost, sources: Sources) -> dict[str, Any]:
    """The inventory node_add.yml runs with (JSON, which Ansible reads as YAML)."""
    ssh = new.ssh
    root = str(new.extra_vars.get("node_root", "/opt/letsinfer"))
    known = shlex.quote(str(ssh.known_hosts_file))
    new_vars: dict[str, Any] = {
        "ansible_host": ssh.host,
        "ansible_port": ssh.port,
        "ansible_user": ssh.user,
        # the key ssh_reach recorded or found: OpenSSH refuses any other
        "ansible_ssh_common_args": f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={known}",
    }
    if ssh.identity is not None:
        new_vars["ansible_ssh_private_key_file"] = str(ssh.identity)
    if new.become:
        new_vars["ansible_become"] = True
    peers = [p for p in main.peers if p.name != new.name and p.address != ssh.host]
    peer_ssh = {k: v for k, v in new_vars.items() if k != "ansible_host"}
    main_vars: dict[str, Any] = {
        "ansible_connection": "local",
        "ansible_host": main.address,
        "ansible_python_interpreter": main.python,
        "node_home": main.home,
    }
    group_vars: dict[str, Any] = {
        "node_version": sources.version,
        "node_wheelhouse": str(sources.wheelhouse) if sources.wheelhouse else "",
        "node_index_url": sources.index_url or "",
        "node_cluster_fingerprint": main.ca_fingerprint,
        "node_gateway_port": main.gateway_port,
        "main_executable": main.executable,
        "main_home": main.home,
        "main_agent_port": main.agent_port,
        # enrollment's steps on the host use the host's own letsinfer
        "main_child_executable": f"{root}/current/bin/letsinfer",
        "main_child_home": str(new.extra_vars.get("node_home", "")),
        "firewall_gateway_port": main.gateway_port,
        "firewall_control_port": main.control_port,
        "firewall_agent_port": main.agent_port,
        "firewall_extra_members": [p.address for p in peers],
        **dict(new.extra_vars),
    }
    return {
        "letsinfer": {
            "vars": group_vars,
            "children": {
                "letsinfer_main": {"hosts": {main.name: main_vars}},
                "letsinfer_children": {"hosts": {new.name: new_vars}},
                # reached like the new host, to admit it to their tables
                "letsinfer_peers": {
                    "hosts": {p.name: {**peer_ssh, "ansible_host": p.address} for p in peers}
                },
            },
        }
    }


def run(
    playbooks: Path,
    main: MainSide,
    new: NewHost,
    sources: Sources,
    on_event: Callable[[Progress], None] | None = None,
) -> ApplyResult:
    with tempfile.TemporaryDirectory(prefix="letsinfer-node-add-") as tmp:
        hosts = Path(tmp) / "hosts.yml"
        hosts.write_text(json.dumps(inventory(main, new, sources)))
        return apply(playbooks / PLAYBOOK, hosts, on_event=on_event)


def changed(result: ApplyResult) -> int:
    """How many tasks changed something, on any host."""
    return sum(h.changed for h in result.progress.hosts.values())
