"""Removing a node from the cluster: its work goes with it.

In one transaction: every placement group with a task on the node is deleted
(its GPU claims with it: a parallel group spanning the node goes whole, since
it cannot run without that task), the node is marked removed (the row stays
for the record; its name is free for a new enrollment) and its certificate is
revoked, with one audit record naming what went. Stopping the node's engines
and the gateway's routes comes after the commit (see ``MainNode.node_removed``).
"""

from __future__ import annotations

from dataclasses import dataclass

from letsinfer.store import AuthorityStore, NodeRecord, StoreError


class RemovalRefused(StoreError):
    """Nothing changed."""


@dataclass(frozen=True)
class RemovedGroup:
    pg_id: str
    service: str


@dataclass(frozen=True)
class Removal:
    node: NodeRecord
    groups: tuple[RemovedGroup, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "node": self.node.name,
            "node_id": self.node.id,
            "address": self.node.address,
            "placement_groups": [{"id": g.pg_id, "model": g.service} for g in self.groups],
        }


def remove_node(
    store: AuthorityStore, name: str, *, actor: str, role: str | None = "main"
) -> Removal:
    node = store.find_node(name)
    if node is None:
        removed = [n for n in store.list_nodes(include_removed=True) if name in (n.id, n.name)]
        if removed:
            raise RemovalRefused(f"node {name!r} is already removed (see `node list --all`)")
        raise RemovalRefused(f"no node {name!r} (see `letsinfer node list`)")
    if node.role == "main":
        raise RemovalRefused("the main cannot remove itself")
    with store.transaction():
        groups = []
        for pg_id in sorted({t.pg_id for t in store.tasks_on_node(node.id)}):
            pg = store.get_placement_group(pg_id)
            if pg is None:
                continue
            groups.append(RemovedGroup(pg.id, pg.service))
            store.delete_placement_group(pg.id)
        store.remove_node(node.id)
        gone = ", ".join(f"{g.pg_id} ({g.service})" for g in groups) or "none"
        store.append_audit(
            actor,
            "node.remove",
            "ok",
            role=role,
            target=node.name,
            detail=f"node {node.id}; certificate sha256:{node.cert_fingerprint or '-'} revoked; "
            f"placement groups removed: {gone}",
        )
    return Removal(node, tuple(groups))
