"""What uses the data in this node's home: its placement groups and, on the
main, the models whose source file the model store holds.

On the main this comes from the authority; on a child from its main's last
word (the groups placed on it, running or stopped, sent with every answer to
its facts and kept in ``<var>/groups.json`` for when the node is not running).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from letsinfer.home import Home
from letsinfer.store import AuthorityStore, PgTaskRecord, PlacementGroupRecord, ServiceRecord


@dataclass(frozen=True)
class GroupUse:
    pg_id: str
    model: str
    digest: str  # the model's artifact
    desired: str  # running or stopped: the authority's word
    engine: bool = False  # an engine of it runs on this node now


@dataclass(frozen=True)
class NodeUses:
    role: str  # main or child
    groups: list[GroupUse]  # the placement groups on this node
    # Main only: digest -> models whose source is this store (children fetch it from here).
    origins: dict[str, list[str]] = field(default_factory=dict)
    known: bool = True  # False: a child that never heard its main's word

    def running_digests(self) -> set[str]:
        return {g.digest for g in self.groups if g.desired == "running" or g.engine}


def groups_file(home: Home) -> Path:
    return home.var / "groups.json"


def save_groups(home: Home, groups: list[dict[str, Any]]) -> None:
    """Keep the main's word on this child's groups (written only when it changed)."""
    path = groups_file(home)
    text = json.dumps(groups, sort_keys=True)
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def child_uses(home: Home, groups: list[dict[str, Any]] | None, engines: set[str]) -> NodeUses:
    """A child's uses: ``groups`` as its main last said (None: read the kept copy),
    ``engines`` the placement groups with an engine running here now."""
    if groups is None:
        try:
            groups = json.loads(groups_file(home).read_text())
        except (OSError, ValueError):
            return NodeUses("child", [], known=False)
    assert groups is not None
    return NodeUses(
        "child",
        [
            GroupUse(
                g["pg_id"], g["service"], g["artifact_digest"], g["desired"], g["pg_id"] in engines
            )
            for g in groups
        ],
    )


def _digests(store: AuthorityStore, svc: ServiceRecord, pg: PlacementGroupRecord) -> list[str]:
    """The files a group's engine reads: its weights (its own while an update
    rolls out, else its model's), then its model's LoRA adapters'."""
    weights = pg.artifact_digest or svc.artifact_digest
    return [weights, *(a.artifact_digest for a in store.list_adapters(svc.name))]


def main_uses(store: AuthorityStore, node_id: str, engines: set[str]) -> NodeUses:
    services = {s.name: s for s in store.list_services() if not s.is_external}
    origins: dict[str, list[str]] = {}
    for s in services.values():
        origins.setdefault(s.artifact_digest, []).append(s.name)
    for a in store.list_adapters():
        origins.setdefault(a.artifact_digest, []).append(a.name)
    for name in services:  # weights kept for `model rollback --weights`
        for w in store.weights_history(name):
            if name not in origins.setdefault(w.artifact_digest, []):
                origins[w.artifact_digest].append(name)
    groups = []
    for pg in store.list_placement_groups():
        if node_id not in {t.node_id for t in store.pg_tasks(pg.id)} and pg.node_id != node_id:
            continue
        svc = services.get(pg.service)
        if svc is not None:
            groups += [
                GroupUse(pg.id, pg.service, digest, pg.desired, pg.id in engines)
                for digest in _digests(store, svc, pg)
            ]
    return NodeUses("main", groups, origins)


def groups_for_child(
    store: AuthorityStore, node_id: str, tasks: list[PgTaskRecord] | None = None
) -> list[dict[str, Any]]:
    """What the main tells a child about every group placed on it (see child_uses);
    ``tasks``: the node's tasks when the caller read them already."""
    out = []
    for task in store.tasks_on_node(node_id) if tasks is None else tasks:
        pg = store.get_placement_group(task.pg_id)
        svc = store.get_service(pg.service) if pg is not None else None
        if pg is not None and svc is not None:
            out += [
                {
                    "pg_id": pg.id,
                    "service": svc.name,
                    "artifact_digest": digest,
                    "desired": pg.desired,
                }
                for digest in _digests(store, svc, pg)
            ]
    return out
