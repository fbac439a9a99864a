"""The main's in-memory view of its nodes and placement groups.

Refreshed from the authority by the main's background loop (at most every
``min_interval_s``); metrics read it at scrape time, so neither a scrape nor a
request reads the database. States are passed through as the store has them
(ready, starting, failed, parked, ...): a new state needs no change here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from letsinfer.store import AuthorityStore

log = logging.getLogger("letsinfer.telemetry")


@dataclass(frozen=True)
class NodeSample:
    id: str
    name: str
    role: str
    state: str
    paused: bool
    facts_at: float | None  # the main's wall clock when facts last arrived
    cert_not_after: float | None
    firewall: bool | None
    audit_problem: str | None
    gpus: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class GroupSample:
    pg_id: str
    model: str
    node: str  # the head task's node name
    desired: str
    state: str
    restarts: int
    detail: str | None


@dataclass
class ClusterView:
    store: AuthorityStore
    min_interval_s: float = 2.0
    nodes: tuple[NodeSample, ...] = ()
    groups: tuple[GroupSample, ...] = ()
    models: tuple[str, ...] = ()
    _at: float = field(default=-float("inf"))

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._at < self.min_interval_s:
            return
        self._at = now
        try:
            every = self.store.list_nodes(include_removed=True)
            groups = self.store.list_placement_groups()
            models = tuple(s.name for s in self.store.list_services())
        except Exception:  # keep the last view; the next round tries again
            log.exception("could not refresh the cluster view")
            return
        names = {n.id: n.name for n in every}
        nodes = [n for n in every if n.state != "removed"]
        self.nodes = tuple(
            NodeSample(
                id=n.id,
                name=n.name,
                role=n.role,
                state=n.state,
                paused=n.paused,
                facts_at=n.facts_at,
                cert_not_after=n.cert_not_after,
                firewall=(n.facts or {}).get("firewall"),
                audit_problem=n.audit_problem,
                gpus=tuple((n.facts or {}).get("gpus", [])),
            )
            for n in nodes
        )
        self.groups = tuple(
            GroupSample(
                pg_id=g.id,
                model=g.service,
                node=names.get(g.node_id, g.node_id),
                desired=g.desired,
                state=g.state,
                restarts=g.restarts,
                detail=g.detail,
            )
            for g in groups
        )
        self.models = models
