"""Reach one machine over SSH (fabric) before anything is changed there.

``check`` proves, in this order, that the address answers SSH, that the host
key is the one known for it (a host never seen before has its key recorded,
as OpenSSH's ``StrictHostKeyChecking=accept-new`` does; a different key is
refused), that the key logs in, and that the account acts as root (directly
or through ``sudo -n``). Each failure is an ``SshError`` whose message says
which and what to do, so ``node add --ssh`` stops before Ansible runs.
"""

from __future__ import annotations

import base64
import hashlib
import socket
from dataclasses import dataclass
from pathlib import Path

from fabric import Connection
from paramiko import (
    AuthenticationException,
    BadHostKeyException,
    MissingHostKeyPolicy,
    PKey,
    SSHClient,
    SSHException,
)
from paramiko.ssh_exception import NoValidConnectionsError

CONNECT_TIMEOUT_S = 15


class SshError(Exception):
    """The machine cannot be used over SSH; nothing was changed on it."""


@dataclass(frozen=True)
class SshTarget:
    host: str
    user: str = "root"
    port: int = 22
    identity: Path | None = None  # a private key file; None: the user's default keys
    known_hosts: Path = Path("~/.ssh/known_hosts")

    @property
    def known_hosts_file(self) -> Path:
        return self.known_hosts.expanduser()

    @property
    def where(self) -> str:
        return f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")


@dataclass(frozen=True)
class Reached:
    host_key: str  # SHA256:... of the key the host presented
    recorded: bool  # its key was new and is now in known_hosts
    become: bool  # the account is not root: Ansible becomes root with sudo


def fingerprint(key: PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _AcceptNew(MissingHostKeyPolicy):
    """A host with no key in known_hosts: its key is recorded (a known host with
    another key never gets here: paramiko raises BadHostKeyException)."""

    def __init__(self) -> None:
        self.added: PKey | None = None

    def missing_host_key(self, client: SSHClient, hostname: str, key: PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.added = key


def check(target: SshTarget) -> Reached:
    known = target.known_hosts_file
    connect_kwargs: dict[str, object] = {"banner_timeout": CONNECT_TIMEOUT_S}
    if target.identity is not None:
        if not target.identity.is_file():
            raise SshError(f"--identity {target.identity}: no such file")
        connect_kwargs |= {
            "key_filename": str(target.identity),
            "look_for_keys": False,
            "allow_agent": False,
        }
    conn = Connection(
        target.host,
        user=target.user,
        port=target.port,
        connect_timeout=CONNECT_TIMEOUT_S,
        connect_kwargs=connect_kwargs,
    )
    conn.client.set_missing_host_key_policy(policy := _AcceptNew())
    if known.is_file():
        conn.client.load_host_keys(str(known))
    try:
        try:
            conn.open()
        except BadHostKeyException as exc:
            raise SshError(
                f"host key mismatch for {target.host}: it presented {exc.key.get_name()} "
                f"{fingerprint(exc.key)}, but {known} holds another key for it. If the "
                f"machine was reinstalled, remove its old key (ssh-keygen -f {known} -R "
                f"{target.host}) and run again; otherwise something else answers at that "
                "address. Nothing was changed."
            ) from None
        except AuthenticationException:
            key = f"the key {target.identity}" if target.identity else "the default SSH keys"
            raise SshError(
                f"{target.where} refused {key}: give the key that logs in there "
                "with --identity FILE (and the account with --user). Nothing was changed."
            ) from None
        except (NoValidConnectionsError, TimeoutError, socket.gaierror, OSError) as exc:
            raise SshError(
                f"cannot reach {target.host} on SSH port {target.port}: {exc}. Nothing was changed."
            ) from None
        except SSHException as exc:
            raise SshError(f"SSH to {target.where} failed: {exc}. Nothing was changed.") from None
        if policy.added is not None:
            known.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            conn.client.save_host_keys(str(known))
        presented = conn.client.get_transport().get_remote_server_key()  # type: ignore[union-attr]
        become = target.user != "root"
        if become:
            sudo = conn.run("sudo -n true", hide=True, warn=True, in_stream=False)
            if not sudo.ok:
                raise SshError(
                    f"{target.where} cannot become root without a password (sudo -n): "
                    "onboarding installs a service and a firewall table. Nothing was changed."
                )
        return Reached(fingerprint(presented), policy.added is not None, become)
    finally:
        conn.close()
