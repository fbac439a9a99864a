"""The main's desk for its children's reports: signed facts in, desired state
out, routing decided from them.

It runs on the control plane's thread (letsinfer/control/thread.py) with that
thread's store connection; routing changes are posted to the gateway's loop,
which owns the routing table. Nothing it does per report grows with the
number of nodes: it reads the reporting node's row and its own tasks, judges
only the data links that node is part of, and keeps what it needs about the
others in memory (the fact ledger, the task board, link states, the view).
The facts themselves are written in batches (letsinfer/authority/factwriter.py)
and a report is answered once its batch is on disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from letsinfer.audit.anchor import SignedHead, witness
from letsinfer.authority import engine_keys
from letsinfer.authority.facts import FactLedger
from letsinfer.authority.factwriter import FactWriter
from letsinfer.authority.links import LinkBook, Pair, needed_links
from letsinfer.authority.overload import AttentionClock, Shedder
from letsinfer.authority.parallel import TaskBoard, TaskReport
from letsinfer.authority.placements import desired_for_node
from letsinfer.authority.pressure import group_facts
from letsinfer.contracts.facts import FactError
from letsinfer.contracts.placement import to_wire
from letsinfer.gateway.routing import Replica, ReplicaFacts, RoutingTable
from letsinfer.storage.uses import groups_for_child
from letsinfer.store import AuthorityStore, FactsUpdate, PlacementGroupRecord
from letsinfer.telemetry.view import ClusterView
from letsinfer.trust.peer import Peer
from letsinfer.webhooks.events import emit, iso

log = logging.getLogger("letsinfer.node")

Post = Callable[[Callable[[], None]], None]  # runs a change on the routing table's loop


def replica_for(
    secret: bytes,
    pg_id: str,
    service: str,
    base_url: str,
    capacity: int,
    node_id: str,
    adapters: tuple[str, ...] = (),
) -> Replica:
    """A group's endpoint as the gateway routes to it, with its engine key."""
    key = engine_keys.derive(secret, pg_id, "0")
    return Replica(
        pg_id=pg_id,
        service=service,
        base_url=base_url,
        authorization=f"Bearer {key}",
        capacity=capacity,
        node_id=node_id,
        adapters=adapters,
    )


def hardware(facts: dict[str, Any]) -> dict[str, Any]:
    """What placement, metrics and `doctor --cluster` need from a node's facts."""
    keys = (
        "cpus",
        "memory_bytes",
        "memory_available",
        "targets",
        "gpus",
        "artifacts",
        "firewall",
    )
    return {k: facts[k] for k in keys if k in facts}


class ReportDesk:
    def __init__(
        self,
        store: AuthorityStore,
        writer: FactWriter,
        routing: RoutingTable,
        post: Post,
        view: ClusterView,
        secret: bytes,
        clock: AttentionClock,
        *,
        heartbeat_interval_s: float,
        stale_after_s: float,
        proof_ttl_s: float,
        shedder: Shedder | None = None,
    ) -> None:
        self.store = store
        self.shedder = shedder
        self.writer = writer
        self.routing = routing
        self.post = post
        self.view = view
        self.secret = secret
        self.clock = clock
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stale_after_s = stale_after_s
        self.ledger = FactLedger(clock=clock.now)
        self.tasks = TaskBoard()
        self.links = LinkBook(store, self.ledger, stale_after_s, proof_ttl_s)
        self._started = clock.now()
        # node -> {(service, pg)} published from its facts
        self._remote: dict[str, set[tuple[str, str]]] = {}
        # (pg id, task) -> last observation written; only changes are written
        self._observed: dict[tuple[str, str], tuple[object, ...]] = {}
        # (service, pg) -> what was last published, so an unchanged group is not posted again
        self._published: dict[tuple[str, str], tuple[object, ...]] = {}
        self.revoked: list[str] = []  # sent to every child (its agent plane refuses them)
        # A report's routing changes, held until its batch is on disk: what the
        # gateway serves, the authority already says (`model show`: ready).
        self._held: list[Callable[[], None]] | None = None
        self._revoked_rev: int | None = None

    # -- routing, on the gateway's loop -------------------------------------
    def _post(self, change: Callable[[], None]) -> None:
        if self._held is not None:
            self._held.append(change)
        else:
            self.post(change)

    def _publish(self, replica: Replica) -> None:
        key = (replica.service, replica.pg_id)
        shape = (replica.base_url, replica.capacity, replica.node_id, replica.adapters)
        if self._published.get(key) == shape:
            return
        self._published[key] = shape
        routing = self.routing
        self._post(lambda: routing.publish(replica))

    def _withdraw(self, service: str, pg_id: str, why: str) -> None:
        self._published.pop((service, pg_id), None)
        routing = self.routing
        self._post(lambda: routing.withdraw(service, pg_id, why))

    def _park(self, service: str, pg_id: str, why: str) -> None:
        self._published.pop((service, pg_id), None)
        routing = self.routing
        self._post(lambda: routing.park(service, pg_id, why))

    def _forget(self, service: str, pg_id: str) -> None:
        self._published.pop((service, pg_id), None)
        routing = self.routing
        self._post(lambda: routing.forget(service, pg_id))

    def _observe(self, service: str, pg_id: str, facts: ReplicaFacts) -> None:
        routing = self.routing
        self._post(lambda: routing.observe(service, pg_id, facts))

    # -- a report ------------------------------------------------------------
    def admit(self) -> int | None:
        """None: take the next report; else the Retry-After to shed it with."""
        if self.shedder is None:
            return None
        return self.shedder.admit(self.writer.backlog)

    def heard(self, node_id: str) -> None:
        """A report the main shed (503): the node is alive; nothing else is taken."""
        self.writer.heard(node_id)

    async def report(
        self, peer: Peer, cert_der: bytes, envelope: dict[str, object]
    ) -> dict[str, object]:
        """Raises FactError (refused and audited by the caller), or
        NotRecorded (its batch could not be written: 503)."""
        held: list[Callable[[], None]] = []
        self._held = held  # no await until the answer is ready: only this report's
        try:
            answer, recorded = self._take(peer, cert_der, envelope)
        finally:
            self._held = None
        try:
            await recorded  # answered once its facts (and their sequence) are on disk
        finally:  # routing follows the freshest facts, recorded or not
            for change in held:
                self.post(change)
        return answer

    def _take(
        self, peer: Peer, cert_der: bytes, envelope: dict[str, object]
    ) -> tuple[dict[str, object], asyncio.Future[None]]:
        node = self.store.get_node(peer.identity.id, facts=False)
        if node is None:
            raise FactError("unknown node")
        facts = self.ledger.accept(peer, cert_der, envelope, persisted_seq=node.facts_seq)
        seen = None
        if facts.audit is not None:
            a = facts.audit
            seen = witness(node, SignedHead(a.count, a.hash, a.signature), a.problem)
            if seen.problem != node.audit_problem and seen.problem is not None:
                log.error("node %s: %s", node.name, seen.problem)
                self.store.append_audit(  # at once, never in a batch
                    f"node:{node.id}",
                    "node.audit-head",
                    "flagged",
                    target=node.name,
                    detail=seen.problem,
                )
        kept = hardware(facts.model_dump(mode="json"))
        at = time.time()
        not_after = peer.identity.not_after.timestamp()
        recorded = self.writer.facts(
            FactsUpdate(
                node.id,
                kept,
                at,
                facts.seq,
                cert_fingerprint=peer.identity.fingerprint,
                witness=seen,
                cert_not_after=not_after,
            )
        )
        self.view.note_facts(
            node.id,
            kept,
            at,
            heard_at=self.clock.now(),
            cert_not_after=not_after,
            audit_problem=seen.problem if seen is not None else node.audit_problem,
        )
        pairs = self.links.involving(node.id)
        if pairs:  # only a node in a parallel group, or with a recorded link
            self.reconcile_links(pairs)
        tasks = self.store.tasks_on_node(node.id)
        wanted: dict[str, PlacementGroupRecord] = {}
        stopping: list[PlacementGroupRecord] = []
        for t in tasks:
            pg = self.store.get_placement_group(t.pg_id)
            if pg is not None and pg.desired == "running":
                wanted[pg.id] = pg
            elif pg is not None and pg.state != "stopped" and t.task == "0":
                stopping.append(pg)
        for p in facts.placements:
            pg_now = wanted.get(p.pg_id)
            if pg_now is not None and p.generation < pg_now.generation and p.state != "ready":
                # From before the main asked for a fresh start (model start, a new
                # release): its parked or failed engine is about to be replaced.
                p = p.model_copy(update={"state": "starting", "detail": "starting afresh"})
            self.tasks.report(
                p.pg_id,
                p.task,
                TaskReport(
                    node.id,
                    p.state,
                    p.base_url,
                    p.capacity,
                    p.detail,
                    tuple(p.adapters),
                    tuple(p.adapter_digests),
                ),
            )
            state = (p.state, p.base_url, p.pid, p.capacity, p.restarts, p.detail, p.generation)
            # Facts arrive every interval: write an observation only when it changed.
            if p.pg_id in wanted and self._observed.get((p.pg_id, p.task)) != state:
                self._observed[(p.pg_id, p.task)] = state
                self.writer.write(_task_observation(p.pg_id, p.task, p.state, p.detail))
                if len(self.store.pg_tasks(p.pg_id)) == 1:
                    self.writer.write(
                        _group_observation(
                            p.pg_id,
                            state=p.state,
                            endpoint=p.base_url,
                            pid=p.pid,
                            capacity=p.capacity,
                            restarts=p.restarts,
                            detail=p.detail,
                            generation=p.generation,
                        )
                    )
        reported = {p.pg_id for p in facts.placements}
        for pg in stopping:  # stopped on purpose and no engine reported any more
            if pg.id not in reported and self._observed.get((pg.id, "-")) != ("stopped",):
                self._observed[(pg.id, "-")] = ("stopped",)
                self.writer.write(_group_observation(pg.id, state="stopped"))
        published: set[tuple[str, str]] = set()
        for pg in wanted.values():
            self._observed.pop((pg.id, "-"), None)
            if self._route(pg):
                published.add((pg.service, pg.id))
                self._weigh(pg)
        for service, pg_id in self._remote.get(node.id, set()) - published:
            if self.store.get_placement_group(pg_id) is None:  # removed (replaced, model removed)
                self._forget(service, pg_id)
            elif pg_id not in wanted:  # a wanted one was withdrawn above, saying why
                self._withdraw(service, pg_id, "not ready on its node")
        if published:
            self._remote[node.id] = published
        else:
            self._remote.pop(node.id, None)
        answer: dict[str, object] = {
            "placements": [
                to_wire(d) for d in desired_for_node(self.store, node.id, self.secret, tasks)
            ],
            "paused": node.paused,
            "interval_s": self.heartbeat_interval_s,
            # Children refuse these on their agent plane (link challenges).
            "revoked": self.revoked,
            # Every group placed there, stopped ones too (what `node cleanup` may free).
            "groups": groups_for_child(self.store, node.id, tasks),
        }
        return answer, recorded

    def _route(self, pg: PlacementGroupRecord) -> bool:
        """Publish a group's endpoint if every task is ready, it is not paused and
        every data link its plan needs is proven; otherwise withdraw it, saying why."""
        tasks = self.store.pg_tasks(pg.id)
        expected = {t.task for t in tasks}
        url = self.tasks.endpoint(pg.id, expected)
        parked = self.tasks.parked(pg.id)
        if parked is not None:
            if len(tasks) > 1:
                self._observe_group(pg, None, parked.detail)
            self._park(pg.service, pg.id, parked.detail or "parked")
            return False
        why = None
        if pg.paused_reason:
            why = f"paused: {pg.paused_reason}; run `letsinfer model resume {pg.service}`"
        else:
            missing = [
                self.links.label(link)
                for link in needed_links(tasks)
                if not self.links.is_proven(link)
            ]
            if missing:
                why = f"waiting for proof of data link(s) {', '.join(missing)}"
        if why is None and url is None:
            why = f"waiting for task(s) {', '.join(self.tasks.waiting_for(pg.id, expected))}"
        head = self.tasks.head(pg.id)
        if len(tasks) > 1:
            self._observe_group(pg, url if why is None else None, why)
        if why is not None or url is None:
            self._withdraw(pg.service, pg.id, why or "not ready")
            return False
        capacity = head.capacity if head and head.capacity else 1
        adapters = self._current_adapters(pg.service, head) if head else ()
        self._publish(
            replica_for(self.secret, pg.id, pg.service, url, capacity, tasks[0].node_id, adapters)
        )
        return True

    def _current_adapters(self, service: str, head: TaskReport) -> tuple[str, ...]:
        """The adapters an engine loaded that it may be sent, in its load order
        (a request's adapter id is the place): one whose file is not the one
        the authority holds under that name now (an engine that was away when
        the adapter was replaced) keeps its place but matches no request."""
        if not head.adapters or len(head.adapter_digests) != len(head.adapters):
            return head.adapters  # (an agent that reports no files: by name, as before)
        holds = {a.name: a.artifact_digest for a in self.store.list_adapters(service)}
        return tuple(
            name if holds.get(name) == digest else ""
            for name, digest in zip(head.adapters, head.adapter_digests, strict=True)
        )

    def _weigh(self, pg: PlacementGroupRecord) -> None:
        """A published group's load, GPU temperature and facts age, for routing."""
        tasks = [
            (t.task, t.node_id, self.store.task_gpus(pg.id, t.task))
            for t in self.store.pg_tasks(pg.id)
        ]
        facts = group_facts(pg.id, tasks, self.ledger.views)
        if facts is not None:
            self._observe(pg.service, pg.id, facts)

    def _observe_group(self, pg: PlacementGroupRecord, url: str | None, why: str | None) -> None:
        """A parallel group's own state: ready only when published."""
        if url is not None:
            state = "ready"
        elif pg.paused_reason:
            state = "paused"
        else:
            states = [r.state for r in self.tasks.reports.get(pg.id, {}).values()]
            state = next((s for s in ("parked", "failed", "restarting") if s in states), "starting")
        head = self.tasks.head(pg.id)
        seen = (state, url, why)
        if self._observed.get((pg.id, "*")) != seen:
            self._observed[(pg.id, "*")] = seen
            self.writer.write(
                _group_observation(
                    pg.id,
                    state=state,
                    endpoint=url,
                    capacity=head.capacity if head and url else None,
                    detail=why,
                )
            )

    # -- in the background -----------------------------------------------------
    def round(self) -> None:
        """Every reconcile interval: what changed since the last round (a few
        small reads), nodes gone quiet, links, the view."""
        revs = self.store.revisions()
        if revs["revoked"] != self._revoked_rev:
            self.revoked = self.store.revoked_fingerprints()
            self._revoked_rev = revs["revoked"]
        self.links.load(revs["groups"])
        self.sweep_stale()
        self.reconcile_links()
        self.view.refresh()

    def reconcile_links(self, links: set[Pair] | None = None) -> None:
        """Record link changes; withdraw at once the groups a lost link paused."""
        settled = self.clock.now() - self._started > self.stale_after_s
        for pg_id in self.links.reconcile(links, may_lose=settled):
            pg = self.store.get_placement_group(pg_id)
            if pg is not None:
                self._withdraw(pg.service, pg.id, f"paused: {pg.paused_reason}")

    def sweep_stale(self) -> None:
        """Routing health comes from fresh facts only (on the attention clock:
        while the main sheds load, nobody ages)."""
        window = self.stale_after_s
        for node_id, published in list(self._remote.items()):
            if self.ledger.fresh(node_id, window) is None:
                for service, pg_id in published:
                    self._withdraw(
                        service, pg_id, f"node {node_id} sent no facts for {window:.0f}s"
                    )
                del self._remote[node_id]
                self.tasks.forget_node(node_id)
                log.warning("node %s is stale: its placement groups are unroutable", node_id)
                self._stale_event(node_id, window)

    def _stale_event(self, node_id: str, window: float) -> None:
        """A webhook event (letsinfer.webhooks): once per silence, named by the
        last facts the node sent."""
        node = self.store.get_node(node_id, facts=False)
        if node is None:
            return
        try:
            emit(
                self.store,
                f"node.stale:{node_id}:{node.facts_seq}",
                "node.stale",
                {
                    "node": node.name,
                    "silent_for_s": round(window),
                    "last_facts_at": iso(node.facts_at),
                },
            )
        except Exception:  # an event lost must not stop the sweep
            log.exception("could not queue the webhook event for stale node %s", node.name)

    def forget_node(self, node_id: str, groups: list[tuple[str, str]]) -> None:
        """A node was removed: its groups leave routing now (``groups``: the
        (service, group) pairs its removal deleted)."""
        for service, pg_id in {*groups, *self._remote.pop(node_id, set())}:
            self._forget(service, pg_id)
        self.tasks.forget_node(node_id)
        self.ledger.views.pop(node_id, None)


def _task_observation(
    pg_id: str, task: str, state: str, detail: str | None
) -> Callable[[AuthorityStore], None]:
    return lambda store: store.record_task_observation(pg_id, task, state, detail)


def _group_observation(pg_id: str, **observed: Any) -> Callable[[AuthorityStore], None]:
    return lambda store: store.record_pg_observation(pg_id, **observed)
