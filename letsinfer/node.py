"""A running main node: authority store, gateway and the node's own agent.

The agent part reconciles: it reads the placement groups the authority wants
on this node, keeps an engine running for each, and reports what it observes
back to the authority and the gateway's routing table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from letsinfer.agent.ports import free_port
from letsinfer.agent.supervisor import EngineStatus, EngineSupervisor, SupervisionPolicy
from letsinfer.authority import engine_keys
from letsinfer.authority.modelstore import ModelFileError, verify_artifact
from letsinfer.config import Settings
from letsinfer.engines.launch import EngineTask, LaunchPlan, plan_llamacpp
from letsinfer.engines.releases import Release
from letsinfer.gateway.app import Gateway, create_app
from letsinfer.gateway.directory import Directory
from letsinfer.gateway.metrics import start_metrics_server
from letsinfer.gateway.routing import Replica, RoutingTable
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.store import AuthorityStore, PlacementGroupRecord

log = logging.getLogger("letsinfer.node")

_ENGINE_HOST = "127.0.0.1"  # the main's own engines: reachable by its gateway only


class MainNode:
    def __init__(self, home: Home, settings: Settings, identity: NodeIdentity) -> None:
        self.home = home
        self.settings = settings
        self.identity = identity
        self.store = AuthorityStore(home.database)
        self.routing = RoutingTable()
        self.directory = Directory(self.store)
        self.gateway = Gateway.build(self.directory, self.routing, settings.gateway)
        agent = settings.agent
        self.supervisor = EngineSupervisor(
            home.engine_logs,
            SupervisionPolicy(
                ready_timeout_s=settings.engine.ready_timeout_s,
                backoff_initial_s=agent.restart_backoff_initial_s,
                backoff_max_s=agent.restart_backoff_max_s,
                health_interval_s=agent.health_interval_s,
            ),
            self._on_engine_status,
        )
        self._engine_secret = engine_keys.ensure_secret(self.store)
        self._services: dict[str, str] = {}  # pg id -> model service
        self._stopping: set[asyncio.Task[None]] = set()

    def app(self) -> FastAPI:
        return create_app(self.gateway, lifespan=self._lifespan)

    @asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self.directory.refresh()
        self.reconcile()
        loop = asyncio.create_task(self._background())
        gw = self.settings.gateway
        metrics = start_metrics_server(self.gateway.metrics, gw.host, gw.metrics_port)
        try:
            yield
        finally:
            if metrics is not None:
                metrics.close()
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
            await self.supervisor.stop_all()
            await asyncio.gather(*self._stopping, return_exceptions=True)
            await self.gateway.aclose()
            self.store.close()

    async def _background(self) -> None:
        interval = self.settings.agent.reconcile_interval_s
        while True:
            await asyncio.sleep(min(interval, self.settings.gateway.key_cache_ttl_s))
            self.directory.refresh()
            try:
                self.reconcile()
            except Exception:  # a bad row must not stop the loop
                log.exception("reconcile failed")

    # -- agent ------------------------------------------------------------
    def reconcile(self) -> None:
        wanted = {
            pg.id: pg
            for pg in self.store.list_placement_groups(node_id=self.identity.node_id)
            if pg.desired == "running"
        }
        for pg_id in set(self.supervisor.runners) - set(wanted):
            task = asyncio.create_task(self.supervisor.stop(pg_id))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        for pg in wanted.values():
            if pg.id not in self.supervisor.runners:
                self._start(pg)

    def _start(self, pg: PlacementGroupRecord) -> None:
        svc = self.store.get_service(pg.service)
        rel = self.store.get_release(pg.release_id)
        if svc is None or rel is None:
            self.store.record_pg_observation(
                pg.id, state="failed", detail="its model or release is missing"
            )
            return
        try:
            model_path = verify_artifact(self.home.model_store, svc.artifact_digest)
        except ModelFileError as exc:
            self.store.record_pg_observation(pg.id, state="failed", detail=str(exc))
            self.routing.withdraw(pg.service, pg.id, str(exc))
            return
        release = Release(
            id=rel["id"],
            engine=rel["engine"],
            version=rel["version"],
            target=rel["target"],
            artifacts=rel["artifacts"],
            launch=rel["launch"],
        )
        engine = self.settings.engine
        secret = self._engine_secret

        def make_plan(port: int) -> LaunchPlan:
            task = EngineTask(
                pg_id=pg.id,
                model_name=svc.name,
                model_path=model_path,
                host=_ENGINE_HOST,
                port=port,
                engine_key=engine_keys.derive(secret, pg.id, "0", port),
                threads=engine.threads,
                context=engine.context,
                parallel=engine.parallel,
            )
            return plan_llamacpp(release, task, self.home.engine_run)

        self._services[pg.id] = pg.service
        self.supervisor.ensure(pg.id, make_plan, lambda: free_port(_ENGINE_HOST))

    def _on_engine_status(self, st: EngineStatus) -> None:
        service = self._services.get(st.pg_id)
        if service is None:
            return
        if st.state == "ready" and st.base_url and st.port:
            key = engine_keys.derive(self._engine_secret, st.pg_id, "0", st.port)
            self.routing.publish(
                Replica(
                    pg_id=st.pg_id,
                    service=service,
                    base_url=st.base_url,
                    authorization=f"Bearer {key}",
                    capacity=self.settings.engine.parallel,
                    node_id=self.identity.node_id,
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
            )
        except Exception:  # observation is best effort; routing already updated
            log.exception("could not record state of %s", st.pg_id)
