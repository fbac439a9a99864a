"""The main's view of data links: mutual proofs in, link states and pauses out.

A link between two nodes is proven only while each node's fresh facts carry a
proof of the other, each signed by the other's certificate key and recent. A
proven link that stops being proven is lost: every placement group whose plan
needs it is paused (its endpoint leaves routing; its engines keep running)
until an operator runs ``letsinfer model resume``, even if the link returns.
Every change of state is audited.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from letsinfer.authority.facts import FactLedger
from letsinfer.authority.lifecycle import unpark
from letsinfer.store import AuthorityStore, PgTaskRecord, PlacementGroupRecord

log = logging.getLogger("letsinfer.links")

ACTOR = "main:links"

Pair = tuple[str, str]  # node ids, sorted


def pair(a: str, b: str) -> Pair:
    x, y = sorted((a, b))
    return (x, y)


def link_label(link: Pair, names: dict[str, str]) -> str:
    """``n1–n2``: the two nodes' names, in name order."""
    return "–".join(sorted(names.get(n, n) for n in link))


def needed_links(tasks: list[PgTaskRecord]) -> list[Pair]:
    """Every pair of distinct nodes in a group: its tasks talk to each other."""
    nodes = sorted({t.node_id for t in tasks})
    return [pair(a, b) for a, b in itertools.combinations(nodes, 2)]


@dataclass
class LinkBook:
    """Link states as stored (only this book writes them: read once, then kept),
    and the parallel groups meant to run (read again when groups change), so
    that judging one node's links reads nothing about the others."""

    store: AuthorityStore
    ledger: FactLedger
    fresh_within_s: float
    proof_ttl_s: float
    states: dict[Pair, str] | None = None  # as stored: proven, lost
    groups: list[tuple[PlacementGroupRecord, list[PgTaskRecord]]] = field(default_factory=list)
    _groups_rev: int | None = None
    _by_node: dict[str, set[Pair]] = field(default_factory=dict)

    def proven_now(self, link: Pair) -> bool:
        a, b = link
        of_a = self.ledger.verified_links(a, self.fresh_within_s, self.proof_ttl_s)
        of_b = self.ledger.verified_links(b, self.fresh_within_s, self.proof_ttl_s)
        return b in of_a and a in of_b

    def is_proven(self, link: Pair) -> bool:
        return (self.states or {}).get(link) == "proven"

    def load(self, groups_rev: int | None = None) -> None:
        """Read the stored states (once) and the parallel groups (when
        ``groups_rev``, the store's groups revision, moved; None: ask it)."""
        if self.states is None:
            self.states = {(r.node_a, r.node_b): r.state for r in self.store.list_links()}
        if groups_rev is None:
            groups_rev = self.store.revisions()["groups"]
        if groups_rev != self._groups_rev:
            self.groups = self.store.parallel_groups()
            self._groups_rev = groups_rev
        self._index()

    def _index(self) -> None:
        by_node: dict[str, set[Pair]] = {}
        for link in self._needed() | set(self.states or {}):
            for n in link:
                by_node.setdefault(n, set()).add(link)
        self._by_node = by_node

    def _needed(self) -> set[Pair]:
        return {link for _, tasks in self.groups for link in needed_links(tasks)}

    def involving(self, node_id: str) -> set[Pair]:
        """The links a node's facts can change: those a group needs, and those
        with a stored state."""
        return self._by_node.get(node_id, set())

    def label(self, link: Pair) -> str:
        names = {}
        for n in link:
            node = self.store.get_node(n)
            names[n] = node.name if node is not None else n
        return link_label(link, names)

    def reconcile(self, links: set[Pair] | None = None, may_lose: bool = True) -> list[str]:
        """Record links that became proven or were lost; pause the groups a lost
        link breaks. Returns the ids of groups paused now. ``links``: only
        these (one node's, as its facts arrive); None: every link that matters
        (the groups are read again if they changed). ``may_lose`` is false
        while the main has not heard from every node since it started."""
        if links is None or self.states is None:
            self.load()
        stored = self.states if self.states is not None else {}
        if links is None:
            links = self._needed() | set(stored)
        paused: list[str] = []
        changed = False
        for link in sorted(links):
            now = self.proven_now(link)
            if now and stored.get(link) != "proven":
                label = self.label(link)
                with self.store.transaction():
                    self.store.set_link_state(*link, "proven")
                    self.store.append_audit(ACTOR, "link.proven", "ok", target=label)
                stored[link] = "proven"
                changed = True
                log.info("data link %s proven by both ends", label)
            elif not now and stored.get(link) == "proven" and may_lose:
                label = self.label(link)
                hit = [pg for pg, tasks in self.groups if link in needed_links(tasks)]
                with self.store.transaction():
                    self.store.set_link_state(*link, "lost")
                    self.store.append_audit(ACTOR, "link.lost", "ok", target=label)
                    for pg in hit:
                        current = self.store.get_placement_group(pg.id)
                        if current is not None and current.paused_reason is None:
                            self.store.set_pg_paused(pg.id, f"data link {label} lost")
                            self.store.append_audit(
                                ACTOR,
                                "model.pause",
                                "ok",
                                target=pg.service,
                                detail=f"{pg.id}: data link {label} lost",
                            )
                            paused.append(pg.id)
                stored[link] = "lost"
                changed = True
                log.warning("data link %s lost; paused %s", label, ", ".join(paused) or "nothing")
        self.states = stored
        if changed:
            self._index()
        return paused


class ResumeRefused(Exception):
    """A paused group still lacks a proven link (or the model does not exist)."""


@dataclass(frozen=True)
class Resumed:
    model: str
    placement_groups: int
    unpaused: list[str]

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "placement_groups": self.placement_groups,
            "unpaused": self.unpaused,
        }


def _blocking_resume(store: AuthorityStore, service: str) -> list[str]:
    """Why a paused group of ``service`` cannot resume: a link it needs is not proven."""
    states = {(r.node_a, r.node_b): r.state for r in store.list_links()}
    names = {n.id: n.name for n in store.list_nodes(include_removed=True)}
    out = []
    for pg in store.list_placement_groups(service=service):
        if not pg.paused_reason:
            continue
        for link in needed_links(store.pg_tasks(pg.id)):
            if states.get(link) != "proven":
                label = link_label(link, names)
                out.append(
                    f"{pg.id}: data link {label} is {states.get(link, 'unproven')}; "
                    "it must be proven again before the group resumes"
                )
    return out


def resume_model(
    store: AuthorityStore, name: str, *, actor: str, role: str | None = None
) -> Resumed:
    """``model resume``: start the model's groups and lift link pauses, only when
    every link they need is proven again. Audited either way; all or nothing."""
    svc = store.resolve_service(name)
    if svc is None:
        raise ResumeRefused(f"no model {name!r}")
    blocked = _blocking_resume(store, svc.name)
    if blocked:
        why = "; ".join(blocked)
        store.append_audit(actor, "model.resume", "denied", role=role, target=svc.name, detail=why)
        raise ResumeRefused(why)
    paused = [pg.id for pg in store.list_placement_groups(service=svc.name) if pg.paused_reason]
    with store.transaction():
        n = store.set_service_desired(svc.name, "running")
        unpark(store, svc.name)
        for pg_id in paused:
            store.set_pg_paused(pg_id, None)
        store.append_audit(
            actor,
            "model.resume",
            "ok",
            role=role,
            target=svc.name,
            detail=f"unpaused {', '.join(paused)}" if paused else None,
        )
    return Resumed(svc.name, n, paused)
