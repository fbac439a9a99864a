"""Who this node is: its id, name, role and, on a child, where its main is.

Kept in ``node.json`` under the home's etc directory; absent until the node is
initialised. The CLI reads it to check each command's scope.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from letsinfer.home import admin_gid, share_with_group

Role = Literal["main", "child", "candidate"]


@dataclass(frozen=True)
class NodeIdentity:
    node_id: str
    name: str
    role: Role
    main_address: str | None = None  # the main's control address, on a child
    main_id: str | None = None  # the main's node id, checked in its certificate
    gateway_url: str | None = None  # where clients reach the gateway
    cluster: str | None = None  # sha256 fingerprint of the cluster CA certificate

    @property
    def enrolled(self) -> bool:
        return self.role in ("main", "child")

    @classmethod
    def new_main(cls, name: str | None = None) -> NodeIdentity:
        return cls(node_id=new_node_id(), name=name or socket.gethostname(), role="main")

    @classmethod
    def new_candidate(cls, name: str | None = None) -> NodeIdentity:
        return cls(node_id=new_node_id(), name=name or socket.gethostname(), role="candidate")


def new_node_id() -> str:
    return uuid.uuid4().hex[:16]


def load_identity(path: Path) -> NodeIdentity | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    known = {f for f in NodeIdentity.__dataclass_fields__}
    return NodeIdentity(**{k: v for k, v in data.items() if k in known})


def save_identity(path: Path, identity: NodeIdentity) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    # Not a secret: the CLI of a `letsinfer` group member reads it (scopes).
    gid = admin_gid()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(identity), fh, indent=2)
    if gid is not None:
        share_with_group(tmp, gid)
        tmp.chmod(0o640)
    tmp.replace(path)
