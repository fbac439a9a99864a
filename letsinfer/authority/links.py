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
from dataclasses import dataclass

from letsinfer.authority.facts import FactLedger
from letsinfer.authority.lifecycle import unpark
from letsinfer.store import AuthorityStore, PgTaskRecord

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
    store: AuthorityStore
    ledger: FactLedger
    fresh_within_s: float
    proof_ttl_s: float
    states: dict[Pair, str] | None = None  # as stored: proven, lost

    def proven_now(self, link: Pair) -> bool:
        a, b = link
        of_a = self.ledger.verified_links(a, self.fresh_within_s, self.proof_ttl_s)
        of_b = self.ledger.verified_links(b, self.fresh_within_s, self.proof_ttl_s)
        return b in of_a and a in of_b

    def is_proven(self, link: Pair) -> bool:
        return (self.states or {}).get(link) == "proven"

    def reconcile(self, may_lose: bool = True) -> list[str]:
        """Record links that became proven or were lost; pause the groups a lost
        link breaks. Returns the ids of groups paused now. ``may_lose`` is false
        while the main has not heard from every node since it started."""
        stored = {(r.node_a, r.node_b): r.state for r in self.store.list_links()}
        groups = [
            (pg, tasks)
            for pg in self.store.list_placement_groups()
            if pg.desired == "running" and len(tasks := self.store.pg_tasks(pg.id)) > 1
        ]
        needed = {link for _, tasks in groups for link in needed_links(tasks)}
        names = {n.id: n.name for n in self.store.list_nodes(include_removed=True)}
        paused: list[str] = []
        for link in sorted(needed | set(stored)):
            label = link_label(link, names)
            now = self.proven_now(link)
            if now and stored.get(link) != "proven":
                with self.store.transaction():
                    self.store.set_link_state(*link, "proven")
                    self.store.append_audit(ACTOR, "link.proven", "ok", target=label)
                stored[link] = "proven"
                log.info("data link %s proven by both ends", label)
            elif not now and stored.get(link) == "proven" and may_lose:
                hit = [pg for pg, tasks in groups if link in needed_links(tasks)]
                with self.store.transaction():
                    self.store.set_link_state(*link, "lost")
                    self.store.append_audit(ACTOR, "link.lost", "ok", target=label)
                    for pg in hit:
                        if pg.paused_reason is None:
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
                log.warning("data link %s lost; paused %s", label, ", ".join(paused) or "nothing")
        self.states = stored
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
