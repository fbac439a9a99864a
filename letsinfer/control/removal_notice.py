"""Telling a removed node, over its agent plane, to stop its engines now.

Best effort and after the removal committed: a node that cannot be reached
hears it at its next report instead (the main refuses its facts with code
``node_removed``, and the node stops its engines on that).
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from letsinfer.agent.api import REMOVED_PATH
from letsinfer.store import AuthorityStore, NodeRecord
from letsinfer.trust.client import ClusterClient, PeerMismatch, error_message
from letsinfer.trust.material import TlsFiles

LATER = "its engines stop when it next reports to the main, which refuses it as removed"
# The agent answers once its engines have stopped, each given up to 5 s to
# exit before it is killed (agent/supervisor.py): wait longer than that.
NOTICE_TIMEOUT_S = 15.0


async def tell_removed(
    files: TlsFiles,
    node: NodeRecord,
    audit: AuthorityStore,
    actor: str,
    timeout: float = NOTICE_TIMEOUT_S,
) -> dict[str, Any]:
    """Ask the node's agent to stop its engines; audit and return what happened."""
    told, stopped = False, None
    if node.address is None:
        detail = f"it has no agent address; {LATER}"
    else:
        client = ClusterClient(files, expect_node=node.id, timeout=timeout)
        try:
            resp = await client.arequest("POST", f"https://{node.address}{REMOVED_PATH}")
        except (httpx.HTTPError, PeerMismatch, ssl.SSLError, OSError) as exc:
            detail = f"cannot reach it at {node.address} ({exc}); {LATER}"
        else:
            if resp.status_code == 200:
                told, stopped = True, resp.json().get("engines_stopped")
                detail = f"its agent at {node.address} stopped {stopped} engine(s)"
            else:
                detail = f"its agent at {node.address} answered: {error_message(resp)}; {LATER}"
    audit.append_audit(
        actor, "node.remove.notify", "ok" if told else "failed", target=node.name, detail=detail
    )
    return {"told": told, "engines_stopped": stopped, "notice": detail}
