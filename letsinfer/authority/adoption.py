"""What blocks a node from moving to another cluster (design: Trust, Adoption).

Active work or attached children block a move. Work is what the main holds
for a node: placement groups it wants running with a task there. For a main
leaving its own cluster that is every group it wants running, and its
children are every enrolled node but itself. A child cannot read the main's
authority: it asks the main (``GET /v1/agent/work``) and adds what its agent
runs right now.
"""

from __future__ import annotations

from typing import Any

from letsinfer.store import AuthorityStore


def work_on_node(store: AuthorityStore, node_id: str) -> list[dict[str, Any]]:
    """Placement groups the authority wants running with a task on ``node_id``."""
    out = []
    for pg_id in sorted({t.pg_id for t in store.tasks_on_node(node_id)}):
        pg = store.get_placement_group(pg_id)
        if pg is not None and pg.desired == "running":
            out.append({"id": pg.id, "model": pg.service, "state": pg.state})
    return out


def main_blockers(store: AuthorityStore) -> list[str]:
    """Why this main may not leave its cluster now (empty: it may)."""
    found = []
    active = [pg for pg in store.list_placement_groups() if pg.desired == "running"]
    if active:
        names = ", ".join(f"{pg.id} ({pg.service})" for pg in active)
        found.append(
            f"active placement groups: {names} (stop them first: `letsinfer model stop MODEL`)"
        )
    children = [n.name for n in store.list_nodes() if n.role == "child"]
    if children:
        found.append(
            f"attached children: {', '.join(children)} (remove them first: "
            "`letsinfer node remove NAME`)"
        )
    return found
