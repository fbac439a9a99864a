"""A running main node: authority store, gateway and the node's own agent.

The agent part reconciles: it reads the placement groups the authority wants
on this node, keeps an engine running for each, and reports what it observes
back to the authority and the gateway's routing table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

from letsinfer.agent.api import create_agent_app
from letsinfer.agent.engine_load import read_loads
from letsinfer.agent.firewall import FirewallProbe
from letsinfer.agent.hardware import gpu_probe, host_facts
from letsinfer.agent.placement import PlacementRunner
from letsinfer.agent.runtime import (
    advertise_address,
    advertiser_for,
    instance_name,
    stop_engines,
)
from letsinfer.agent.supervisor import EngineStatus, EngineSupervisor, SupervisionPolicy
from letsinfer.authority import engine_keys
from letsinfer.authority.anchor import SignedHead, open_authority, witness
from letsinfer.authority.audit_echo import AuditEcho
from letsinfer.authority.denials import DenialLog
from letsinfer.authority.facts import FactLedger
from letsinfer.authority.links import LinkBook, link_label, needed_links
from letsinfer.authority.parallel import TaskBoard, TaskReport
from letsinfer.authority.placements import desired_for_node
from letsinfer.authority.pressure import group_facts, hottest
from letsinfer.authority.removal import Removal
from letsinfer.config import Settings
from letsinfer.contracts.artifacts import present_digests
from letsinfer.contracts.facts import FactError
from letsinfer.contracts.placement import DesiredPlacement, to_wire
from letsinfer.control.admin_socket import AdminPlane, LocalGate
from letsinfer.control.app import ControlContext, create_control_app
from letsinfer.control.local_ops import local_router
from letsinfer.control.ops import ops_router
from letsinfer.control.removal_notice import tell_removed
from letsinfer.control.typed_app import typed_app
from letsinfer.gateway.app import Gateway, create_app
from letsinfer.gateway.directory import Directory
from letsinfer.gateway.metrics import start_metrics_server
from letsinfer.gateway.routing import Replica, ReplicaFacts, RoutingTable
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity, load_identity
from letsinfer.lifecycle.routes import lifecycle_router
from letsinfer.lifecycle.serving import Serving
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.planes import RunningPlane, tls_server
from letsinfer.release import runtime
from letsinfer.storage.routes import storage_router
from letsinfer.storage.uses import groups_for_child, main_uses
from letsinfer.store import PlacementGroupRecord
from letsinfer.telemetry.collector import ClusterCollector
from letsinfer.telemetry.view import ClusterView
from letsinfer.trust import pki, renewal
from letsinfer.trust.material import ClusterCA, presented_fingerprint, tls_files
from letsinfer.trust.peer import Peer, server_context
from letsinfer.usage.recorder import RequestLog

log = logging.getLogger("letsinfer.node")

_ENGINE_HOST = "127.0.0.1"  # the main's own engines: reachable by its gateway only


class MainNode:
    def __init__(self, home: Home, settings: Settings, identity: NodeIdentity) -> None:
        self.home = home
        self.settings = settings
        self.identity = identity
        self.store = open_authority(home)
        self.denials = DenialLog(self.store, settings.audit.denial_interval_s)
        self.audit_echo = AuditEcho(self.store)  # a log line per change and refusal
        self.routing = RoutingTable()
        self.directory = Directory(self.store)
        self.records = (
            RequestLog(home.requests_database, settings.requests)
            if settings.requests.enabled
            else None
        )
        self.gateway = Gateway.build(
            self.directory,
            self.routing,
            settings.gateway,
            denials=self.denials,
            records=self.records,
            tracing=settings.tracing,
        )
        self.supervisor = EngineSupervisor(
            home.engine_logs,
            home.engine_run,
            SupervisionPolicy.from_settings(settings),
            self._on_engine_status,
        )
        self._engine_secret = engine_keys.ensure_secret(self.store)
        trusted = runtime.trusted_for(home, settings.release.trusted_keys, None)
        self.placements = PlacementRunner(
            home.model_store,
            home.engine_run,
            self.supervisor,
            _ENGINE_HOST,
            self._pg_failed,
            trusted=trusted,
        )
        self.lifecycle = Serving(
            self.store,
            self.routing,
            self.apply_now,
            settings.lifecycle,
            trusted=trusted,
            stale_after_s=settings.control.node_stale_after_s,
        )
        self.ledger = FactLedger()
        self.tasks = TaskBoard()
        self.links = LinkBook(
            self.store,
            self.ledger,
            settings.control.node_stale_after_s,
            settings.links.proof_ttl_s,
        )
        self._started = time.monotonic()
        # (pg id, task) -> last observation written; only changes are written
        self._observed: dict[tuple[str, str], tuple[object, ...]] = {}
        self.gpus = gpu_probe(settings.hardware.fake_gpus)
        self.firewall = FirewallProbe()
        # Nodes and groups in memory, for metrics at scrape time (no database read).
        self.view = ClusterView(self.store)
        self.gateway.metrics.registry.register(ClusterCollector(self.view, self.routing))
        self._remote: dict[str, set[tuple[str, str]]] = {}  # node -> {(service, pg)} published
        self._desired: dict[str, DesiredPlacement] = {}  # this node's own, as last reconciled
        self.server: Any = None  # the uvicorn server, set by `up`
        self.moved = False  # this main joined another cluster (see _watch_identity)

    def app(self) -> FastAPI:
        return create_app(self.gateway, lifespan=self._lifespan)

    def gateway_url(self) -> str:
        gw = self.settings.gateway
        host = advertise_address(gw.host, None)
        return f"http://{host}:{gw.port}/v1"

    def control_address(self) -> str:
        control = self.settings.control
        return f"{advertise_address(control.host, control.advertise)}:{control.port}"

    async def _start_planes(self) -> list[RunningPlane]:
        files = tls_files(self.home, self.identity)
        ctx = server_context(files.cert, files.key, files.ca)
        control = ControlContext(
            store=self.store,
            ca=ClusterCA(self.home, self.identity),
            identity=self.identity,
            gateway_url=self.gateway_url(),
            heartbeat_interval_s=self.settings.control.heartbeat_interval_s,
            on_facts=self.on_facts,
            model_store=self.home.model_store,
            mirror=MirrorLayout.for_home(self.home),
            release_key=runtime.ensure_cluster_key(self.home).text,
            denials=self.denials,
            on_change=self.apply_now,
        )
        fingerprint = presented_fingerprint(self.home, self.identity)
        agent = self.settings.agent
        planes = [
            RunningPlane(
                tls_server(
                    create_control_app(control),
                    self.settings.control.host,
                    self.settings.control.port,
                    ctx,
                    on_refused=self.denials.tls_refusals("control"),
                    name="control plane",
                )
            ),
            RunningPlane(
                tls_server(
                    create_agent_app(
                        self.home,
                        lambda: self.identity,
                        fingerprint,
                        self.store,
                        self.denials,
                        revoked=self.store.is_revoked,
                    ),
                    agent.api_host,
                    agent.api_port,
                    ctx,
                    on_refused=self.denials.tls_refusals("agent"),
                    name="agent plane",
                )
            ),
        ]
        admin = typed_app("letsinfer admin socket")
        admin.include_router(ops_router(self.store, self.identity, on_change=self.apply_now))
        admin.include_router(local_router(self.store, self.node_removed))
        admin.include_router(lifecycle_router(self.lifecycle, self.home.model_store))
        admin.include_router(
            storage_router(
                self.home,
                lambda: self.identity.name,
                lambda: main_uses(self.store, self.identity.node_id, self._engine_groups()),
                self.store,
                self._facts_changed,
            )
        )
        planes.append(
            AdminPlane(self.home.admin_socket, LocalGate(admin, self.denials, os.geteuid()))
        )
        for plane in planes:
            await plane.start()
        return planes

    def apply_now(self) -> None:
        """A change made through the admin socket takes effect before it answers."""
        self.directory.refresh(force=True)
        self.reconcile()

    async def node_removed(self, removal: Removal) -> dict[str, Any]:
        """After a removal committed: the gateway stops routing to the node's
        placement groups at once, then the node's agent is told to stop them."""
        node_id = removal.node.id
        for g in removal.groups:
            self.routing.forget(g.service, g.pg_id)
        for service, pg_id in self._remote.pop(node_id, set()):
            self.routing.forget(service, pg_id)
        self.tasks.forget_node(node_id)
        self.ledger.views.pop(node_id, None)
        self.apply_now()  # this node's own tasks of a removed parallel group stop too
        return await tell_removed(
            tls_files(self.home, self.identity), removal.node, self.store, "main"
        )

    async def _watch_identity(self) -> None:
        """`node accept` on this main moved it into another cluster: stop the
        main's planes so that `up` retires the authority and runs the agent."""
        path = self.home.identity_file
        seen = path.stat().st_mtime_ns
        while True:
            await asyncio.sleep(1.0)
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime_ns != seen:
                    seen = path.stat().st_mtime_ns
                    now = load_identity(path)
                    if now is not None and now.role != "main":
                        log.warning("this main moved into another cluster; switching to an agent")
                        self.moved = True
                        if self.server is not None:
                            self.server.should_exit = True
                        return

    @asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        if self.store.anchor is not None:  # records appended without the key
            self.store.anchor.advance(self.store)
        self.directory.refresh()
        await self.gateway.restore_usage()  # keys' spent budgets, before serving
        self.record_own_facts()
        await self.placements.adopt_running()  # engines a previous run left serving
        self.reconcile()
        self.view.refresh(force=True)
        planes = await self._start_planes()
        adv = None
        if self.settings.discovery.enabled:
            gw = self.settings.gateway
            adv = advertiser_for(
                self.identity,
                presented_fingerprint(self.home, self.identity),
                self.settings.control.host,
                self.settings.control.port,
                gateway=f"http://{instance_name(self.identity)}.local:{gw.port}/v1",
            )
            await adv.start()
        loop = asyncio.create_task(self._background())
        watch = asyncio.create_task(self._watch_identity())
        denials = asyncio.create_task(self.denials.run())
        echo = asyncio.create_task(self.audit_echo.run())
        weigh = asyncio.create_task(self._weigh_own_engines())
        records = asyncio.create_task(self.records.run()) if self.records else None
        metrics = await start_metrics_server(self.gateway.metrics, self.settings.gateway)
        try:
            yield
        finally:
            if metrics is not None:
                await metrics.stop()
            for task in (loop, watch, denials, echo, weigh, records):
                if task is None:
                    continue
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if adv is not None:
                await adv.stop()
            for plane in planes:
                await plane.stop()
            await stop_engines(self.home, self.placements)
            await self.gateway.aclose()
            self.store.close()

    async def _background(self) -> None:
        interval = self.settings.agent.reconcile_interval_s
        rounds = 0
        while True:
            if rounds % 10 == 0:
                self._renew_own_certificate()
                self.record_own_facts()
            rounds += 1
            await asyncio.sleep(min(interval, self.settings.gateway.key_cache_ttl_s))
            self.directory.refresh()
            try:
                self.reconcile()
                self.sweep_stale()
                self.reconcile_links()
            except Exception:  # a bad row must not stop the loop
                log.exception("reconcile failed")
            self.view.refresh()

    # -- this node's own engines ---------------------------------------------
    def record_own_facts(self) -> None:
        facts = {
            **host_facts(self.gpus),
            "artifacts": present_digests(self.home.model_store),
            "firewall": self.firewall.loaded(),
        }
        self.store.record_node_facts(
            self.identity.node_id, _hardware(facts), cert_not_after=self._own_cert_expiry()
        )

    def _renew_own_certificate(self) -> None:
        """Children ask the main for theirs; the main issues its own."""
        files = tls_files(self.home, self.identity)
        try:
            if renewal.due(files, self.settings.control.renew_certificates_before_s):
                ca = ClusterCA(self.home, self.identity)
                renewal.renew_main(files, ca, self.store, self.identity.node_id)
        except Exception:  # said in the log and by doctor; the next round tries again
            log.exception("could not renew this node's certificate")

    def _own_cert_expiry(self) -> float | None:
        """When the certificate on disk expires (the one the next start presents)."""
        try:
            cert = pki.load_cert(tls_files(self.home, self.identity).cert.read_bytes())
        except (OSError, pki.CertificateError):
            return None
        return cert.not_valid_after_utc.timestamp()

    async def _facts_changed(self) -> None:
        self.record_own_facts()

    def _engine_groups(self) -> set[str]:
        return {pg for pg, r in self.supervisor.runners.items() if r.pid is not None}

    def reconcile(self) -> None:
        desired = desired_for_node(self.store, self.identity.node_id, self._engine_secret)
        self._desired = {d.pg_id: d for d in desired}
        self.placements.apply(desired)
        paused = {n.id for n in self.store.list_nodes() if n.paused}
        self.routing.set_paused_nodes(paused)
        for pg_id, adapters in self.placements.adapters.items():  # adopted engines' too
            service = self.placements.services.get(pg_id)
            if service is not None:
                self.routing.set_adapters(service, pg_id, adapters)

    async def _weigh_own_engines(self) -> None:
        """This node's own engines, as a child's agent reports its own: every
        heartbeat interval, their load and their GPUs' temperature to routing."""
        interval = self.settings.control.heartbeat_interval_s
        async with httpx.AsyncClient(timeout=min(1.0, interval)) as client:
            while True:
                try:
                    await self.weigh_own_engines(client)
                except Exception:  # a probe bug must not end the loop
                    log.exception("could not read this node's engine load")
                await asyncio.sleep(interval)

    async def weigh_own_engines(self, client: httpx.AsyncClient) -> None:
        serving = []
        for pg_id, runner in self.supervisor.runners.items():
            st, d = runner.status, self._desired.get(pg_id)
            # Single-task groups only: a parallel group is weighed from its facts.
            if st.state == "ready" and st.base_url and d is not None and not d.group:
                serving.append((pg_id, st.base_url, d.engine_key))
        loads = await read_loads(client, serving)
        gpus = self.gpus.gpus()
        now = time.monotonic()
        for pg_id, load in loads.items():
            service, d = self.placements.services.get(pg_id), self._desired.get(pg_id)
            if service is None or d is None:
                continue
            facts = ReplicaFacts(now, load.slots_free, load.queue_depth, hottest(gpus, d.gpu_uuids))
            self.routing.observe(service, pg_id, facts)

    def _pg_failed(self, pg_id: str, why: str) -> None:
        self.store.record_pg_observation(
            pg_id, state="failed", detail=why, generation=self.placements.generations.get(pg_id)
        )
        service = self.placements.services.get(pg_id)
        if service:
            self.routing.withdraw(service, pg_id, why)

    def _replica(
        self,
        pg_id: str,
        service: str,
        base_url: str,
        capacity: int,
        node_id: str,
        adapters: tuple[str, ...] = (),
    ) -> Replica:
        key = engine_keys.derive(self._engine_secret, pg_id, "0")
        return Replica(
            pg_id=pg_id,
            service=service,
            base_url=base_url,
            authorization=f"Bearer {key}",
            capacity=capacity,
            node_id=node_id,
            adapters=adapters,
        )

    def _on_engine_status(self, st: EngineStatus) -> None:
        service = self.placements.services.get(st.pg_id)
        if service is None:
            return
        if st.state == "ready" and st.base_url:
            self.routing.publish(
                self._replica(
                    st.pg_id,
                    service,
                    st.base_url,
                    self.settings.engine.parallel,
                    self.identity.node_id,
                    self.placements.adapters.get(st.pg_id, ()),
                )
            )
            log.info(
                "model %s: placement group %s ready at %s (pid %s)",
                service,
                st.pg_id,
                st.base_url,
                st.pid,
            )
        elif st.state == "stopped":
            self.routing.forget(service, st.pg_id)
        elif st.state == "parked":
            self.routing.park(service, st.pg_id, st.detail or "parked")
        else:
            self.routing.withdraw(service, st.pg_id, st.detail or st.state)
        try:
            self.store.record_pg_observation(
                st.pg_id,
                state=st.state,
                endpoint=st.base_url,
                pid=st.pid,
                capacity=self.settings.engine.parallel if st.state == "ready" else None,
                restarts=st.restarts,
                detail=st.detail,
                generation=self.placements.generations.get(st.pg_id),
            )
        except Exception:  # observation is best effort; routing already updated
            log.exception("could not record state of %s", st.pg_id)

    # -- children: signed facts in, desired state out ------------------------
    def on_facts(
        self, peer: Peer, cert_der: bytes, envelope: dict[str, object]
    ) -> dict[str, object]:
        """Raises FactError (refused and audited by the caller)."""
        node = self.store.get_node(peer.identity.id)
        if node is None:
            raise FactError("unknown node")
        facts = self.ledger.accept(peer, cert_der, envelope, persisted_seq=node.facts_seq)
        seen = None
        if facts.audit is not None:
            a = facts.audit
            seen = witness(node, SignedHead(a.count, a.hash, a.signature), a.problem)
            if seen.problem != node.audit_problem and seen.problem is not None:
                log.error("node %s: %s", node.name, seen.problem)
                self.store.append_audit(
                    f"node:{node.id}",
                    "node.audit-head",
                    "flagged",
                    target=node.name,
                    detail=seen.problem,
                )
        self.store.record_node_facts(
            node.id,
            _hardware(facts.model_dump(mode="json")),
            peer.identity.fingerprint,
            seq=facts.seq,
            witness=seen,
            cert_not_after=peer.identity.not_after.timestamp(),
        )
        self.reconcile_links()
        wanted: dict[str, PlacementGroupRecord] = {}
        stopping: list[PlacementGroupRecord] = []
        for t in self.store.tasks_on_node(node.id):
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
                TaskReport(node.id, p.state, p.base_url, p.capacity, p.detail, tuple(p.adapters)),
            )
            seen = (p.state, p.base_url, p.pid, p.capacity, p.restarts, p.detail, p.generation)
            # Facts arrive every interval: write an observation only when it changed.
            if p.pg_id in wanted and self._observed.get((p.pg_id, p.task)) != seen:
                self._observed[(p.pg_id, p.task)] = seen
                self.store.record_task_observation(p.pg_id, p.task, p.state, p.detail)
                if len(self.store.pg_tasks(p.pg_id)) == 1:
                    self.store.record_pg_observation(
                        p.pg_id,
                        state=p.state,
                        endpoint=p.base_url,
                        pid=p.pid,
                        capacity=p.capacity,
                        restarts=p.restarts,
                        detail=p.detail,
                        generation=p.generation,
                    )
        reported = {p.pg_id for p in facts.placements}
        for pg in stopping:  # stopped on purpose and no engine reported any more
            if pg.id not in reported:
                self.store.record_pg_observation(pg.id, state="stopped")
        published: set[tuple[str, str]] = set()
        for pg in wanted.values():
            if self._route(pg):
                published.add((pg.service, pg.id))
                self._weigh(pg)
        for service, pg_id in self._remote.get(node.id, set()) - published:
            if self.store.get_placement_group(pg_id) is None:  # removed (replaced, model removed)
                self.routing.forget(service, pg_id)
            else:
                self.routing.withdraw(service, pg_id, "not ready on its node")
        self._remote[node.id] = published
        desired = desired_for_node(self.store, node.id, self._engine_secret)
        return {
            "placements": [to_wire(d) for d in desired],
            "paused": node.paused,
            "interval_s": self.settings.control.heartbeat_interval_s,
            # Children refuse these on their agent plane (link challenges).
            "revoked": self.store.revoked_fingerprints(),
            # Every group placed there, stopped ones too (what `node cleanup` may free).
            "groups": groups_for_child(self.store, node.id),
        }

    def _route(self, pg: PlacementGroupRecord) -> bool:
        """Publish a group's endpoint if every task is ready, it is not paused and
        every data link its plan needs is proven; otherwise withdraw it, saying why."""
        tasks = self.store.pg_tasks(pg.id)
        expected = {t.task for t in tasks}
        url = self.tasks.endpoint(pg.id, expected)
        names = {n.id: n.name for n in self.store.list_nodes(include_removed=True)}
        parked = self.tasks.parked(pg.id)
        if parked is not None:
            if len(tasks) > 1:
                self._observe_group(pg, None, parked.detail)
            self.routing.park(pg.service, pg.id, parked.detail or "parked")
            return False
        why = None
        if pg.paused_reason:
            why = f"paused: {pg.paused_reason}; run `letsinfer model resume {pg.service}`"
        else:
            missing = [
                link_label(link, names)
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
            self.routing.withdraw(pg.service, pg.id, why or "not ready")
            return False
        capacity = head.capacity if head and head.capacity else 1
        adapters = head.adapters if head else ()
        self.routing.publish(
            self._replica(pg.id, pg.service, url, capacity, tasks[0].node_id, adapters)
        )
        return True

    def _weigh(self, pg: PlacementGroupRecord) -> None:
        """A published group's load, GPU temperature and facts age, for routing."""
        tasks = [
            (t.task, t.node_id, self.store.task_gpus(pg.id, t.task))
            for t in self.store.pg_tasks(pg.id)
        ]
        facts = group_facts(pg.id, tasks, self.ledger.views)
        if facts is not None:
            self.routing.observe(pg.service, pg.id, facts)

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
            self.store.record_pg_observation(
                pg.id,
                state=state,
                endpoint=url,
                capacity=head.capacity if head and url else None,
                detail=why,
            )

    def reconcile_links(self) -> None:
        """Record link changes; withdraw at once the groups a lost link paused."""
        settled = time.monotonic() - self._started > self.settings.control.node_stale_after_s
        for pg_id in self.links.reconcile(may_lose=settled):
            pg = self.store.get_placement_group(pg_id)
            if pg is not None:
                self.routing.withdraw(pg.service, pg.id, f"paused: {pg.paused_reason}")

    def sweep_stale(self) -> None:
        """Routing health comes from fresh facts only."""
        window = self.settings.control.node_stale_after_s
        for node_id, published in list(self._remote.items()):
            if published and self.ledger.fresh(node_id, window) is None:
                for service, pg_id in published:
                    self.routing.withdraw(
                        service, pg_id, f"node {node_id} sent no facts for {window:.0f}s"
                    )
                self._remote[node_id] = set()
                self.tasks.forget_node(node_id)
                log.warning("node %s is stale: its placement groups are unroutable", node_id)


def _hardware(facts: dict[str, Any]) -> dict[str, Any]:
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
