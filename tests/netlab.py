"""Bare hosts as network namespaces on one bridge, for tests that run nodes
directly (mDNS, one address per node). The lab's own network builder makes
them; unlike the Ansible lab these hosts have no sshd or private filesystem
(each node gets its own home instead). Needs root."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyroute2 import netns

from tests.lab.netns import FIRST_HOST_OCTET, SUBNET, build_network, kill_namespace, new_prefix


def can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


@dataclass
class NetLab:
    names: Sequence[str]
    prefix: str = field(default_factory=new_prefix)
    hosts: dict[str, str] = field(default_factory=dict)  # name -> address

    def ns(self, name: str) -> str:
        return f"{self.prefix}{name}"

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(n) for n in self.names] + [f"{self.prefix}br"]

    def up(self) -> NetLab:
        members = [
            (self.ns(n), f"{SUBNET}.{FIRST_HOST_OCTET + i}") for i, n in enumerate(self.names)
        ]
        try:
            build_network(f"{self.prefix}br", members)
        except BaseException:
            self.down()
            raise
        self.hosts = {n: address for n, (_, address) in zip(self.names, members, strict=True)}
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
        for ns in self.namespaces:
            kill_namespace(ns)
            with contextlib.suppress(FileNotFoundError, OSError):
                netns.remove(ns)
