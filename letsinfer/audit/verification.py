"""`letsinfer audit verify` as data: every link of the chain, the signed head,
and (on the main) what its children reported. The CLI on a node and the admin
API (a controller's `letsinfer audit verify`) both answer with this."""

from __future__ import annotations

from typing import Any

from letsinfer.audit.anchor import HeadAnchor, check_anchor
from letsinfer.audit.chain import verify_chain
from letsinfer.store import AuthorityStore


def verify_audit(store: AuthorityStore, anchor: HeadAnchor) -> dict[str, Any]:
    """``problems`` empty: intact. ``head``: the record the signed head covers;
    ``unanchored``: records after it, appended without the node key."""
    records = store.list_audit()
    anchored = check_anchor(anchor, store)
    children = [n for n in store.list_nodes() if n.audit_problem and n.role != "main"]
    problems = []
    broken = verify_chain(records)
    if broken is not None:
        problems.append(f"audit chain broken at record {broken.seq}: {broken.reason}")
    problems += [f"audit chain not anchored: {p}" for p in anchored.problems]
    problems += [f"node {n.name}'s audit chain: {n.audit_problem}" for n in children]
    return {
        "records": len(records),
        "head": anchored.head.count if anchored.head else None,
        "unanchored": anchored.unanchored,
        "problems": problems,
    }
