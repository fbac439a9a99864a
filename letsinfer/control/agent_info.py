"""`node info`: a child's agent about itself, asked by the main over mutual
TLS with the main's node certificate. The CLI on the main and the admin API
(for a paired controller) ask through this one function."""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.store import AuthorityStore
from letsinfer.trust.client import ClusterClient, PeerMismatch
from letsinfer.trust.material import tls_files


class InfoRefused(Exception):
    """Why no answer: ``status`` as the admin API says it."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


async def agent_info(
    home: Home, identity: NodeIdentity, store: AuthorityStore, name: str
) -> tuple[str, dict[str, Any]]:
    """The node's name and what its agent says of itself, or InfoRefused."""
    target = store.find_node(name)
    if target is None:
        raise InfoRefused(f"no node {name!r} (see `letsinfer node list`)", 404)
    if target.role == "main" or target.address is None:
        raise InfoRefused(f"{target.name} is the main; see `letsinfer status`", 409)
    client = ClusterClient(tls_files(home, identity), expect_node=target.id)
    try:
        resp = await client.arequest("GET", f"https://{target.address}/v1/agent/info")
    except (httpx.HTTPError, ssl.SSLError, PeerMismatch) as exc:
        raise InfoRefused(f"cannot reach {target.name} at {target.address}: {exc}", 502) from exc
    if resp.status_code != 200:
        raise InfoRefused(f"{target.name} refused: {resp.text}", 502)
    return target.name, resp.json()
