"""Asking a child, over its agent plane, to report now.

A child hears of work the main placed for it only in the answer to its next
report, a heartbeat away. After committing a placement for a child the main
asks it to report at once (its agent's ``REPORT_NOW_PATH``, for this node's
main only). Fire and forget, with a short timeout: a child that does not
answer still reports at its next heartbeat, so its silence is not an error.
"""

from __future__ import annotations

import logging
import ssl

import httpx

from letsinfer.agent.api import REPORT_NOW_PATH
from letsinfer.trust.client import ClusterClient, PeerMismatch
from letsinfer.trust.material import TlsFiles

log = logging.getLogger("letsinfer.control")

REPORT_NOW_TIMEOUT_S = 2.0


async def ask_to_report(
    files: TlsFiles,
    node_id: str,
    address: str | None,
    timeout: float = REPORT_NOW_TIMEOUT_S,
) -> bool:
    """True when the child's agent took the request (it reports now)."""
    if address is None:
        return False
    client = ClusterClient(files, expect_node=node_id, timeout=timeout)
    try:
        resp = await client.arequest("POST", f"https://{address}{REPORT_NOW_PATH}")
    except (httpx.HTTPError, PeerMismatch, ssl.SSLError, OSError) as exc:
        log.debug("asking %s to report now failed: %s", address, exc)
        return False
    if resp.status_code != 200:
        log.debug("%s did not take the request to report now: %d", address, resp.status_code)
    return resp.status_code == 200
