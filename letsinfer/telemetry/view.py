"""The main's in-memory view of its nodes and placement groups.

Metrics read it at scrape time, so neither a scrape nor a request reads the
database. It is kept without re-reading every node: read whole once at start
(:meth:`ClusterView.load`), then each node's facts arrive as they are
accepted (:meth:`ClusterView.note_facts`, from the control plane's thread and
for the main's own from the gateway's) and the background loop reads only
the nodes whose membership changed, and the groups when any changed
(the store's revisions, migration 11). ``nodes`` and ``groups`` are tuples
swapped whole (at most every ``min_interval_s``), safe to read from any
thread. States are passed through as the store has them (ready, starting,
failed, parked, ...): a new state needs no change here.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from letsinfer.store import AuthorityStore, NodeRecord

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
    # When facts last arrived on the main's attention clock (which stands still
    # while it sheds load, see letsinfer.authority.overload); None: not this run.
    heard_at: float | None = None


@dataclass(frozen=True)
class GroupSample:
    pg_id: str
    model: str
    node: str  # the head task's node name
    desired: str
    state: str
    restarts: int
    detail: str | None


def _sample(n: NodeRecord) -> NodeSample:
    return NodeSample(
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


@dataclass
class ClusterView:
    store: AuthorityStore
    min_interval_s: float = 2.0
    nodes: tuple[NodeSample, ...] = ()
    groups: tuple[GroupSample, ...] = ()
    models: tuple[str, ...] = ()
    _at: float = field(default=-float("inf"))
    _samples: dict[str, NodeSample] = field(default_factory=dict)  # every node, removed too
    _revs: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def load(self) -> None:
        """Read every node and group once (the main starting)."""
        revs = self.store.revisions()
        every = self.store.list_nodes(include_removed=True)
        with self._lock:
            self._samples = {n.id: _sample(n) for n in every}
        self._revs = {"nodes": revs["nodes"]}
        self.refresh(force=True)

    def note_facts(
        self,
        node_id: str,
        facts: dict[str, Any],
        at: float,
        heard_at: float | None = None,
        cert_not_after: float | None = None,
        audit_problem: str | None = None,
    ) -> None:
        """A node's facts, as accepted (any thread), with what its witnessed
        audit head says is wrong."""
        with self._lock:
            old = self._samples.get(node_id)
            if old is None:  # enrolled since the last refresh: named then
                old = NodeSample(node_id, node_id, "child", "active", False, None, None, None, None)
            self._samples[node_id] = dataclasses.replace(
                old,
                facts_at=at,
                firewall=facts.get("firewall"),
                gpus=tuple(facts.get("gpus", [])),
                heard_at=heard_at,
                cert_not_after=cert_not_after or old.cert_not_after,
                audit_problem=audit_problem,
            )

    def refresh(self, force: bool = False) -> None:
        """Read what changed since the last refresh (at most every
        ``min_interval_s``) and swap in new tuples."""
        now = time.monotonic()
        if not force and now - self._at < self.min_interval_s:
            return
        self._at = now
        try:
            revs = self.store.revisions()
            changed = self.store.nodes_changed_since(self._revs.get("nodes", 0))
            groups = None
            if force or revs["groups"] != self._revs.get("groups"):
                groups = self.store.list_placement_groups()
            models = None
            if force or revs["directory"] != self._revs.get("directory"):
                models = tuple(s.name for s in self.store.list_services())
        except Exception:  # keep the last view; the next round tries again
            log.exception("could not refresh the cluster view")
            return
        with self._lock:
            for e in changed:
                old = self._samples.get(e.id)
                base = old or NodeSample(
                    e.id, e.name, e.role, e.state, e.paused, None, None, None, None
                )
                self._samples[e.id] = dataclasses.replace(
                    base, name=e.name, role=e.role, state=e.state, paused=e.paused
                )
            samples = tuple(self._samples.values())
        self._revs = {
            "nodes": max([self._revs.get("nodes", 0), *(e.rev for e in changed)]),
            "groups": revs["groups"],
            "directory": revs["directory"],
        }
        names = {s.id: s.name for s in samples}
        self.nodes = tuple(s for s in samples if s.state != "removed")
        if groups is not None:
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
        if models is not None:
            self.models = models
