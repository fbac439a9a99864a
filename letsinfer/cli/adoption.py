"""What blocks `node move-into` and a moving `node accept` here, and asking for it.

A main reads its own authority. A child asks its running agent (admin
socket), which asks the main over mutual TLS and adds the engines it runs now;
with no agent running, the CLI asks the main itself with the node's key.
"""

from __future__ import annotations

import ssl

import httpx

from letsinfer.audit.anchor import open_authority
from letsinfer.authority.adoption import main_blockers
from letsinfer.cli.local import ask_node
from letsinfer.cli.scope import CliContext
from letsinfer.contracts.work import ChildWork
from letsinfer.trust.client import ClusterClient, PeerMismatch, error_message
from letsinfer.trust.material import tls_files


def move_blockers(ctx: CliContext) -> tuple[list[str], str | None]:
    """Why this node may not leave its cluster now (empty: it may), and a note
    to show with a move that goes ahead without the main's word."""
    ident = ctx.identity
    assert ident is not None and ident.enrolled
    if ident.role == "main":
        store = open_authority(ctx.home)
        try:
            return main_blockers(store), None
        finally:
            store.close()
    answer = ask_node(ctx.home, "GET", "/v1/local/work")
    work = ChildWork.from_json(answer) if answer is not None else _ask_main(ctx)
    found = work.blockers()
    return found, None if found else work.note()


def _ask_main(ctx: CliContext) -> ChildWork:
    """No agent runs here (so no engine runs): the main's word, asked directly."""
    ident = ctx.identity
    assert ident is not None
    try:
        client = ClusterClient(tls_files(ctx.home, ident), expect_node=ident.main_id, timeout=5.0)
        resp = client.request("GET", f"https://{ident.main_address}/v1/agent/work")
    except (httpx.HTTPError, ssl.SSLError, PeerMismatch, OSError, ValueError) as exc:
        return ChildWork(None, f"unreachable at {ident.main_address}: {exc}", None)
    if resp.status_code != 200:
        return ChildWork(None, f"it refused: {error_message(resp)}", None)
    return ChildWork(resp.json()["placement_groups"], None, None)
