"""A running main node: authority store, gateway and the node's own agent.

Two threads, each with its event loop and its own store connection (see
letsinfer/control/thread.py): the gateway's (the process's main thread: the
inference plane, this node's own engines, the admin socket) and the control
plane's (the mutual-TLS planes, children's reports through
letsinfer/authority/reports.py, the background work about remote nodes).

The agent part reconciles: it reads the placement groups the authority wants
on this node, keeps an engine running for each, and reports what it observes
back to the authority and the gateway's routing table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
from fastapi import FastAPI

from letsinfer import heap
from letsinfer.agent.api import create_agent_app
from letsinfer.agent.engine_load import read_loads
from letsinfer.agent.firewall import FirewallProbe
from letsinfer.agent.hardware import gpu_probe, host_facts
from letsinfer.agent.placement import PlacementRunner
from letsinfer.agent.runtime import (
    advertise_address,
    advertiser_for,
    end_tasks,
    instance_name,
    stop_engines,
)
from letsinfer.agent.supervisor import EngineStatus, EngineSupervisor, SupervisionPolicy
from letsinfer.audit.anchor import open_authority
from letsinfer.audit.denials import DenialLog
from letsinfer.authority import engine_keys
from letsinfer.authority.audit_echo import AuditEcho
from letsinfer.authority.external import refused_providers
from letsinfer.authority.factwriter import FactWriter
from letsinfer.authority.overload import AttentionClock, Shedder
from letsinfer.authority.placements import desired_for_node
from letsinfer.authority.pressure import hottest
from letsinfer.authority.removal import Removal
from letsinfer.authority.reports import ReportDesk, hardware, replica_for
from letsinfer.capacity.controller import CapacityController
from letsinfer.capacity.metrics import CapacityMetrics
from letsinfer.capacity.placing import Placer, PlacingSettings
from letsinfer.config import Settings
from letsinfer.connections import control_limits
from letsinfer.contracts.artifacts import present_digests
from letsinfer.contracts.placement import DesiredPlacement
from letsinfer.control.admin_socket import AdminPlane, LocalGate
from letsinfer.control.app import ControlContext, create_control_app
from letsinfer.control.local_ops import local_router
from letsinfer.control.ops import ops_router
from letsinfer.control.ops.rollouts import OnLoop
from letsinfer.control.removal_notice import tell_removed
from letsinfer.control.report_notice import ask_to_report
from letsinfer.control.thread import ControlThread, LoopPost
from letsinfer.control.typed_app import typed_app
from letsinfer.exposure.route import exposure_router
from letsinfer.exposure.serving import ExposureRunner
from letsinfer.fetch import FetchPolicy
from letsinfer.gateway.app import Gateway, create_app
from letsinfer.gateway.directory import Directory
from letsinfer.gateway.metrics import start_metrics_server
from letsinfer.gateway.routing import ReplicaFacts, RoutingTable
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity, load_identity
from letsinfer.lifecycle import restarts
from letsinfer.lifecycle.routes import Gates, ServingRollouts, lifecycle_router
from letsinfer.lifecycle.serving import Serving
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.planes import RunningPlane, tls_server
from letsinfer.release import runtime
from letsinfer.storage.routes import storage_router
from letsinfer.storage.uses import main_uses
from letsinfer.store import FactsUpdate, NodeRecord
from letsinfer.telemetry.collector import ClusterCollector
from letsinfer.telemetry.view import ClusterView
from letsinfer.trust import renewal
from letsinfer.trust.discovery import Advertiser
from letsinfer.trust.material import ClusterCA, presented_fingerprint, tls_files
from letsinfer.trust.peer import presenting_server
from letsinfer.usage.recorder import RequestLog
from letsinfer.webhooks.budgets import BudgetWatch
from letsinfer.webhooks.dispatch import Dispatcher

log = logging.getLogger("letsinfer.node")

_ENGINE_HOST = "127.0.0.1"  # the main's own engines: reachable by its gateway only


class MainNode:
    def __init__(self, home: Home, settings: Settings, identity: NodeIdentity) -> None:
        self.home = home
        self.settings = settings
        self.identity = identity
        control = settings.control
        self.store = open_authority(home)  # the gateway thread's connection
        self.control_store = open_authority(home)  # the control thread's
        # Stands still while the control plane sheds load: nodes' facts age on it.
        self.attention = AttentionClock()
        # Refusals are counted from both threads and written by the control thread.
        self.denials = DenialLog(self.control_store, settings.audit.denial_interval_s)
        self.audit_echo = AuditEcho(self.store)  # a log line per change and refusal
        self.routing = RoutingTable(clock=self.attention.now)
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
        self._refuse_providers(FetchPolicy.from_settings(settings))
        # Loads on demand, idle unloads, eviction, replica counts (on this loop).
        self.capacity = CapacityController(
            Placer(
                self.store,
                home,
                PlacingSettings(
                    engine=settings.engine.kind,
                    llama_server_binary=settings.engine.llama_server_binary,
                    context=settings.engine.context,
                    slots=settings.engine.parallel,
                    fresh_within_s=settings.control.node_stale_after_s,
                    main_id=identity.node_id,
                ),
                sign=lambda release: runtime.sign(home, release),
            ),
            self.routing,
            self.directory,
            self.apply_now,
            settings.capacity,
            metrics=CapacityMetrics(self.gateway.metrics.registry, lambda: self.capacity.states),
            placed_on=self.ask_to_report,
        )
        self.capacity.admission = self.gateway.admission
        self.gateway.admission.loader = self.capacity
        self.gateway.availability.loads = self.capacity
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
            # Loopback only, yet from the span too: a port the kernel hands out
            # to outgoing connections can be taken before the engine binds it.
            ports=(settings.engine.port_first, settings.engine.port_last),
        )
        self.lifecycle = Serving(
            self.store,
            self.routing,
            self.apply_now,
            settings.lifecycle,
            trusted=trusted,
            stale_after_s=control.node_stale_after_s,
            window=self.attention.window,
            fit_beside=restarts.memory_check(
                self.store, home.model_store, settings.engine.context, settings.engine.parallel
            ),
        )
        self.gpus = gpu_probe(settings.hardware.fake_gpus)
        self.firewall = FirewallProbe()
        # Nodes and groups in memory, for metrics at scrape time (no database read).
        self.view = ClusterView(self.control_store)
        self.shedder = Shedder(
            self.attention,
            retry_after_s=max(1, round(2 * control.heartbeat_interval_s)),
            interval_s=control.heartbeat_interval_s,
        )
        self.gateway.metrics.registry.register(
            ClusterCollector(
                self.view, self.routing, attention=self.attention.now, control=self.shedder
            )
        )
        self.writer = FactWriter(
            self.control_store, control.facts_batch_interval_s, cost_s=control.report_cost_s
        )
        # Signed webhooks: events queued on disk, sent from the control thread.
        self.webhooks = Dispatcher(
            self.control_store, settings.webhooks, FetchPolicy.from_settings(settings)
        )
        self.control = ControlThread()
        self.desk: ReportDesk | None = None  # made on start (it posts to the gateway's loop)
        self.post: LoopPost | None = None
        self._planes: list[RunningPlane] = []  # on the control thread
        self._desired: dict[str, DesiredPlacement] = {}  # this node's own, as last reconciled
        self._nodes_rev: int | None = None  # the node revision routing's paused set is from
        self.server: Any = None  # the uvicorn server, set by `up`
        self.advertiser: Advertiser | None = None  # while running, with discovery on
        self.moved = False  # this main joined another cluster (see _watch_identity)
        self.exposure = ExposureRunner(home, settings.gateway)  # `exposure enable`'s TLS

    def app(self) -> FastAPI:
        portal = None
        if self.settings.portal.enabled:
            from letsinfer.portal.pages import Portal  # (not loaded when off)

            portal = Portal(self.home, self.settings.portal, self.gateway, self.gateway_url).app
        return create_app(self.gateway, lifespan=self._lifespan, portal=portal)

    def gateway_url(self) -> str:
        gw = self.settings.gateway
        host = advertise_address(gw.host, None)
        return f"http://{host}:{gw.port}/v1"

    def control_address(self) -> str:
        control = self.settings.control
        return f"{advertise_address(control.host, control.advertise)}:{control.port}"

    def control_limits(self) -> Any:
        control = self.settings.control
        return control_limits(
            control.max_connections,
            control.max_connections_per_client,
            control.heartbeat_interval_s,
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )

    async def _control_up(self) -> None:
        """On the control thread: the mutual-TLS planes, the nodes' reports
        and the background work about remote nodes."""
        assert self.desk is not None and self.post is not None
        self.desk.round()  # revocations, parallel groups, link states
        files = tls_files(self.home, self.identity)
        tls = presenting_server(files.cert, files.key, files.ca)
        control = ControlContext(
            store=self.control_store,
            ca=ClusterCA(self.home, self.identity),
            identity=self.identity,
            gateway_url=self.gateway_url(),
            heartbeat_interval_s=self.settings.control.heartbeat_interval_s,
            reports=self.desk,
            model_store=self.home.model_store,
            mirror=MirrorLayout.for_home(self.home),
            release_key=runtime.ensure_cluster_key(self.home).text,
            denials=self.denials,
            on_change=self._apply_from_control,
            home=self.home,
            rollouts=OnLoop(ServingRollouts(self.lifecycle, Gates(self.home)), self.post.loop),
            scene=self._scene_for_control,
            on_removed=self._removed_from_control,
            apply_exposure=self.exposure.apply_from_control,
        )
        agent = self.settings.agent
        self._planes = [
            RunningPlane(
                tls_server(
                    create_control_app(control),
                    self.settings.control.host,
                    self.settings.control.port,
                    tls,
                    on_refused=self.denials.tls_refusals("control"),
                    name="control plane",
                    limits=self.control_limits(),
                )
            ),
            RunningPlane(
                tls_server(
                    create_agent_app(
                        self.home,
                        lambda: self.identity,
                        lambda: tls.fingerprint,
                        self.control_store,
                        self.denials,
                        revoked=self.control_store.is_revoked,
                    ),
                    agent.api_host,
                    agent.api_port,
                    tls,
                    on_refused=self.denials.tls_refusals("agent"),
                    name="agent plane",
                )
            ),
        ]
        for plane in self._planes:
            await plane.start()
        self.control.spawn(self._control_rounds)
        self.control.spawn(self.shedder.watch)
        self.control.spawn(self.denials.run)
        self.control.spawn(self.webhooks.run)

    async def _control_down(self) -> None:
        for plane in self._planes:
            await plane.stop()
        self.writer.flush()  # what is staged goes to disk before the thread ends

    def _refuse_providers(self, policy: FetchPolicy) -> None:
        """External models whose provider's address [fetch] refuses now (the
        setting may have changed since they were added) are not served."""
        refused = refused_providers(self.store, policy)
        for name, (_url, why) in refused.items():
            log.error("model %s is not served: %s", name, why)
        self.gateway.refused_providers = {name: url for name, (url, _) in refused.items()}

    async def _control_rounds(self) -> None:
        interval = self.settings.agent.reconcile_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                assert self.desk is not None
                self.desk.round()
            except Exception:  # a bad row must not stop the loop
                log.exception("the control plane's round failed")

    async def _start_admin(self) -> AdminPlane:
        admin = typed_app("letsinfer admin socket")
        admin.include_router(
            ops_router(self.store, self.identity, on_change=self._apply_here, home=self.home)
        )
        admin.include_router(local_router(self.store, self.node_removed, self._apply_here))
        admin.include_router(exposure_router(self.exposure))
        admin.include_router(lifecycle_router(self.lifecycle, self.home))
        admin.include_router(
            storage_router(
                self.home,
                lambda: self.identity.name,
                lambda: main_uses(self.store, self.identity.node_id, self._engine_groups()),
                self.store,
                self._facts_changed,
            )
        )
        plane = AdminPlane(self.home.admin_socket, LocalGate(admin, self.denials, os.geteuid()))
        await plane.start()
        return plane

    async def _apply_from_control(self) -> None:
        """A controller's change (on the control thread) takes effect on the
        gateway's loop before the control plane answers. Awaited, not waited
        for: the control thread's loop goes on with handshakes and reports while
        a busy gateway gets to it."""
        assert self.post is not None
        await asyncio.wait_for(asyncio.wrap_future(self.post.submit(self.apply_now)), 30)

    async def _removed_from_control(self, removal: Removal) -> dict[str, Any]:
        """A controller's `node remove`, applied on the gateway's loop as the CLI's is."""
        assert self.post is not None
        future = asyncio.run_coroutine_threadsafe(self.node_removed(removal), self.post.loop)
        return await asyncio.wrap_future(future)

    async def _scene_for_control(self) -> tuple[list[str], float, dict[str, object]]:
        """The groups draining now, how long a child may go unheard and the exposure's
        state, read on the gateway's loop (which owns them) for the control plane's displays."""
        assert self.post is not None
        lifecycle, exposure, draining = self.lifecycle, self.exposure, self.routing.draining
        facts = self.post.submit(
            lambda: (sorted(draining()), lifecycle.shown_stale_after_s, exposure.state())
        )
        return await asyncio.wait_for(asyncio.wrap_future(facts), 30)

    async def _apply_here(self) -> None:
        """A change made through the admin socket (on the gateway's own loop)."""
        self.apply_now()

    def apply_now(self) -> None:
        """A change to the authority takes effect now (keys, models, paused
        nodes), on the gateway's loop: before the admin socket or the control
        plane answers the change."""
        self.directory.refresh(force=True)
        self._nodes_rev = None  # read the paused nodes again
        self.reconcile()

    def ask_to_report(self, node: NodeRecord) -> None:
        """The main placed work on a child: ask it, from the control thread
        (fire and forget), to report now rather than at its next heartbeat."""
        files = tls_files(self.home, self.identity)

        def spawn() -> None:
            self.control.spawn(lambda: ask_to_report(files, node.id, node.address))

        self.control.call_soon(spawn)

    async def node_removed(self, removal: Removal) -> dict[str, Any]:
        """After a removal committed: the gateway stops routing to the node's
        placement groups at once, then the node's agent is told to stop them."""
        node_id = removal.node.id
        groups = [(g.service, g.pg_id) for g in removal.groups]
        desk = self.desk

        async def forget() -> None:  # on the control thread, which posts the routes' end
            if desk is not None:
                desk.forget_node(node_id, groups)

        await self.control.run(forget)
        for service, pg_id in groups:  # already posted and run; this says it twice
            self.routing.forget(service, pg_id)
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
        self.view.load()  # the control thread keeps it from here
        self.gateway.read_counts()  # keys' spent budgets: their requests wait for it
        self.record_own_facts()
        await self.placements.adopt_running()  # engines a previous run left serving
        self.reconcile()
        self.post = LoopPost(asyncio.get_running_loop())
        control = self.settings.control
        self.desk = ReportDesk(
            self.control_store,
            self.writer,
            self.routing,
            self.post,
            self.view,
            self._engine_secret,
            self.attention,
            heartbeat_interval_s=control.heartbeat_interval_s,
            stale_after_s=control.node_stale_after_s,
            proof_ttl_s=self.settings.links.proof_ttl_s,
            shedder=self.shedder,
        )
        await self.control.start(self._control_up)
        await self.exposure.start(app)  # the same app over TLS (docs/exposure.md)
        admin = await self._start_admin()
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
            self.advertiser = adv
        loop = asyncio.create_task(self._background(), name="reconcile loop")
        watch = asyncio.create_task(self._watch_identity(), name="identity watch")
        echo = asyncio.create_task(self.audit_echo.run(), name="audit echo")
        weigh = asyncio.create_task(self._weigh_own_engines(), name="engine weighing")
        capacity = asyncio.create_task(self.capacity.run(), name="capacity")
        # Spent budgets are counted on this loop: watched here, off the request path.
        budgets = asyncio.create_task(
            BudgetWatch(self.gateway, self.store, self.settings.webhooks.interval_s).run(),
            name="webhook budgets",
        )
        records = (
            asyncio.create_task(self.records.run(), name="request records")
            if self.records
            else None
        )

        async def serve_metrics() -> RunningPlane | None:
            return await start_metrics_server(
                self.gateway.metrics,
                self.settings.gateway,
                lambda: self.view.nodes,
            )

        # Scrapes are served on the control thread: a big cluster's series take
        # a while to make, and requests must not wait for them.
        metrics = await self.control.run(serve_metrics)
        heap.settle_after_startup()
        try:
            yield
        finally:
            try:
                await self.exposure.stop()
                if metrics is not None:
                    stopping = metrics
                    await self.control.run(stopping.stop)
                await end_tasks([loop, watch, echo, weigh, records, capacity, budgets])
                await self.capacity.aclose()
                if adv is not None:
                    self.advertiser = None
                    await adv.stop()
                await admin.stop()
                ended = await self.control.stop(self._control_down)
            finally:  # whatever failed above, no engine outlives the node
                await stop_engines(self.home, self.placements)
            await self.gateway.aclose()
            if ended:
                self.control_store.close()
            else:  # closing a connection another thread still uses could crash
                log.warning(
                    "the control thread did not end within 30 s; its database "
                    "connection is left for the process's exit to close"
                )
            self.store.close()

    async def _background(self) -> None:
        """The gateway side's round: keys and models, this node's own engines,
        paused nodes; each a small read unless something changed."""
        interval = self.settings.agent.reconcile_interval_s
        rounds = 0
        while True:
            if rounds % 10 == 0:  # (no failure here may end the loop)
                try:
                    if (
                        renewal.renew_main_if_due(
                            tls_files(self.home, self.identity),
                            lambda: ClusterCA(self.home, self.identity),
                            self.store,
                            self.identity.node_id,
                            self.settings.control.renew_certificates_before_s,
                        )
                        and self.advertiser is not None
                    ):
                        fingerprint = presented_fingerprint(self.home, self.identity)
                        await self.advertiser.update_fingerprint(fingerprint)
                except Exception:
                    log.exception("renewing or advertising this node's certificate failed")
                try:
                    self.record_own_facts()
                except Exception:
                    log.exception("recording this node's facts failed")
            rounds += 1
            await asyncio.sleep(min(interval, self.settings.gateway.key_cache_ttl_s))
            try:  # nor a bad row or a busy database
                self.directory.refresh()
                self.reconcile()
            except Exception:
                log.exception("reconcile failed")

    # -- this node's own engines ---------------------------------------------
    def record_own_facts(self) -> None:
        facts = hardware(
            {
                **host_facts(self.gpus),
                "artifacts": present_digests(self.home.model_store),
                "firewall": self.firewall.loaded(),
            }
        )
        expiry = renewal.expiry(tls_files(self.home, self.identity))
        # Written with the nodes' facts, on the control thread; before it runs, here.
        update = FactsUpdate(self.identity.node_id, facts, time.time(), 0, cert_not_after=expiry)
        if not self.control.call_soon(self.writer.stage, update):
            self.store.record_node_facts(self.identity.node_id, facts, cert_not_after=expiry)
        self.view.note_facts(
            self.identity.node_id,
            facts,
            time.time(),
            heard_at=self.attention.now(),
            cert_not_after=expiry,
        )

    async def _facts_changed(self) -> None:
        self.record_own_facts()

    def _engine_groups(self) -> set[str]:
        return {pg for pg, r in self.supervisor.runners.items() if r.pid is not None}

    def reconcile(self) -> None:
        # Sized by this node's own [engine] settings, as a child sizes its own.
        engine = self.settings.engine
        desired = [
            replace(d, threads=engine.threads, context=engine.context, parallel=engine.parallel)
            for d in desired_for_node(self.store, self.identity.node_id, self._engine_secret)
        ]
        self._desired = {d.pg_id: d for d in desired}
        self.placements.apply(desired)
        nodes = self.store.revisions()["nodes"]
        if nodes != self._nodes_rev:  # someone was paused, resumed, added or removed
            self.routing.set_paused_nodes(self.store.paused_node_ids())
            self._nodes_rev = nodes
        for pg_id in self.placements.adapters:  # adopted engines' too
            service = self.placements.services.get(pg_id)
            if service is not None:
                self.routing.set_adapters(service, pg_id, self.placements.adapter_names(pg_id))

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
        now = self.routing.clock()
        for pg_id, load in loads.items():
            service, d = self.placements.services.get(pg_id), self._desired.get(pg_id)
            if service is None or d is None:
                continue
            facts = ReplicaFacts(now, load.slots_free, load.queue_depth, hottest(gpus, d.gpu_uuids))
            self.routing.observe(service, pg_id, facts)

    def _observe(self, pg_id: str, state: str, detail: str | None, **observed: Any) -> None:
        """A group of the main's own in the authority, and its one task, as a
        child's report records them."""
        self.store.record_pg_observation(
            pg_id,
            state=state,
            detail=detail,
            generation=self.placements.generations.get(pg_id),
            **observed,
        )
        task = self.placements.tasks.get(pg_id)
        if task is not None:
            self.store.record_task_observation(pg_id, task, state, detail)

    def _pg_failed(self, pg_id: str, why: str) -> None:
        self._observe(pg_id, "failed", why)
        service = self.placements.services.get(pg_id)
        if service:
            self.routing.withdraw(service, pg_id, why)

    def _on_engine_status(self, st: EngineStatus) -> None:
        service = self.placements.services.get(st.pg_id)
        if service is None:
            return
        if st.state == "ready" and st.base_url:
            self.routing.publish(
                replica_for(
                    self._engine_secret,
                    st.pg_id,
                    service,
                    st.base_url,
                    self.settings.engine.parallel,
                    self.identity.node_id,
                    self.placements.adapter_names(st.pg_id),
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
            self._observe(
                st.pg_id,
                st.state,
                st.detail,
                endpoint=st.base_url,
                pid=st.pid,
                capacity=self.settings.engine.parallel if st.state == "ready" else None,
                restarts=st.restarts,
            )
        except Exception:  # observation is best effort; routing already updated
            log.exception("could not record state of %s", st.pg_id)
