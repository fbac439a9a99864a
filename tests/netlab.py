"""Hosts as network namespaces on one bridge, for tests that need real links
(mDNS, addresses per node). Needs root; nothing touches the machine's own
network: the bridge itself lives in a namespace of its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def can_make_namespaces() -> bool:
    return (
        os.geteuid() == 0 and subprocess.run(["which", "ip"], capture_output=True).returncode == 0
    )


@dataclass
class NetLab:
    names: Sequence[str]
    prefix: str = field(default_factory=lambda: "li" + uuid.uuid4().hex[:6])
    hosts: dict[str, str] = field(default_factory=dict)  # name -> address

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}-br"

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def up(self) -> NetLab:
        subnet = f"10.{200 + int(self.prefix[-2:], 16) % 50}.{int(self.prefix[-4:-2], 16)}"
        _ip("netns", "add", self.bridge_ns)
        br = ["ip", "netns", "exec", self.bridge_ns]
        subprocess.run([*br, "ip", "link", "add", "br0", "type", "bridge"], check=True)
        subprocess.run([*br, "ip", "link", "set", "br0", "up"], check=True)
        for i, name in enumerate(self.names, start=1):
            ns, host_if, br_if = self.ns(name), f"{self.prefix}h{i}", f"{self.prefix}b{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", host_if, "type", "veth", "peer", "name", br_if)
            _ip("link", "set", host_if, "netns", ns)
            _ip("link", "set", br_if, "netns", self.bridge_ns)
            subprocess.run([*br, "ip", "link", "set", br_if, "master", "br0"], check=True)
            subprocess.run([*br, "ip", "link", "set", br_if, "up"], check=True)
            inside = ["ip", "netns", "exec", ns]
            address = f"{subnet}.{i}"
            for cmd in (
                ["ip", "link", "set", "lo", "up"],
                ["ip", "link", "set", host_if, "name", "eth0"],
                ["ip", "addr", "add", f"{address}/24", "dev", "eth0"],
                ["ip", "link", "set", "eth0", "up"],
                ["ip", "route", "add", "224.0.0.0/4", "dev", "eth0"],
            ):
                subprocess.run([*inside, *cmd], check=True)
            self.hosts[name] = address
        return self

    def run(
        self, name: str, *cmd: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(name), *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )

    def popen(
        self, name: str, *cmd: str, env: dict[str, str] | None = None, **kwargs: object
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["ip", "netns", "exec", self.ns(name), *cmd],
            text=True,
            env={**os.environ, **(env or {})},
            **kwargs,
        )  # type: ignore[call-overload]

    def down(self) -> None:
        for ns in [self.ns(n) for n in self.names] + [self.bridge_ns]:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
