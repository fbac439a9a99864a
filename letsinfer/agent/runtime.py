"""A child or candidate node: its agent plane, discovery record and, once
enrolled, its heartbeat to the main over mutual TLS.

When the node's identity changes (enrollment accepted, moved to another
cluster) the process rebuilds its planes with the new certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict

from letsinfer import __version__
from letsinfer.agent.api import create_agent_app
from letsinfer.agent.engine_load import EngineLoad, read_loads
from letsinfer.agent.firewall import FirewallProbe
from letsinfer.agent.hardware import gpu_probe, host_facts
from letsinfer.agent.pacing import ReportPacing, keepalive_s, retry_after
from letsinfer.agent.placement import Fetch, PlacementRunner
from letsinfer.agent.supervisor import EngineStatus, EngineSupervisor, SupervisionPolicy
from letsinfer.audit.anchor import HeadAnchor, head_report
from letsinfer.audit.denials import DenialLog
from letsinfer.config import Settings
from letsinfer.contracts.artifacts import artifact_path, present_digests
from letsinfer.contracts.facts import AuditHeadFact, Facts, GpuFact, PlacementFact, sign
from letsinfer.contracts.placement import DesiredPlacement, from_wire
from letsinfer.contracts.work import ChildWork
from letsinfer.control.admin_socket import AdminPlane, LocalGate
from letsinfer.control.typed_app import typed_app
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity, load_identity
from letsinfer.links.prober import LinkProber
from letsinfer.mirror.fetching import fetch_artifact
from letsinfer.release import runtime
from letsinfer.service import handover
from letsinfer.storage.routes import storage_router
from letsinfer.storage.uses import child_uses, save_groups
from letsinfer.store import AuthorityStore
from letsinfer.trust import pki, renewal
from letsinfer.trust.client import ClusterClient, PeerMismatch, error_code, error_message
from letsinfer.trust.discovery import Advertiser, local_addresses, txt_record
from letsinfer.trust.material import tls_files
from letsinfer.trust.peer import NODE_REMOVED, presenting_client, presenting_server

log = logging.getLogger("letsinfer.agent")

# An early report (an engine changed state, the main asked for one) goes at
# most this soon after the last report: a flapping engine makes one report a
# gap, with every change since, not one per change.
EARLY_REPORT_GAP_S = 0.5


def early_report_wait(since_last_s: float, interval_s: float) -> float:
    """How long an early report still waits, ``since_last_s`` after the last
    report went: until the gap has passed (never past the next heartbeat)."""
    return max(0.0, min(EARLY_REPORT_GAP_S, interval_s) - since_last_s)


def instance_name(identity: NodeIdentity) -> str:
    label = re.sub(r"[^A-Za-z0-9-]", "-", identity.name)[:40].strip("-") or "node"
    return f"{label}-{identity.node_id[:8]}"


def advertise_address(host: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    found = local_addresses(host)
    return found[0] if found else "127.0.0.1"


def advertiser_for(
    identity: NodeIdentity, fingerprint: str, host: str, port: int, gateway: str | None = None
) -> Advertiser:
    pairing = "enrolled" if identity.enrolled else "open"
    return Advertiser(
        instance_name(identity),
        port,
        local_addresses(host),
        txt_record(identity.node_id, fingerprint, identity.role, pairing, gateway),
    )


async def end_tasks(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel a node's background tasks and wait for them; one that had failed
    is logged, not raised: what follows it (stopping the engines) must run."""
    running = [t for t in tasks if t is not None]
    for task in running:
        task.cancel()
    for task, result in zip(
        running, await asyncio.gather(*running, return_exceptions=True), strict=True
    ):
        if isinstance(result, Exception):
            log.error("%s had failed", task.get_name(), exc_info=result)


async def stop_engines(home: Home, placements: PlacementRunner) -> None:
    """When the node process ends: for a restart (`service restart`), leave the
    ready engines serving for the next start to adopt; otherwise stop them."""
    if handover.take(home):
        kept = await placements.hand_over()
        log.info("restarting: %d engine(s) left serving for the next start to adopt", kept)
    else:
        await placements.close()


class LocalPause(BaseModel):
    model_config = ConfigDict(extra="forbid")
    paused: bool


class AgentNode:
    def __init__(self, home: Home, settings: Settings) -> None:
        identity = load_identity(home.identity_file)
        assert identity is not None and identity.role != "main"
        self.home = home
        self.settings = settings
        self.identity = identity
        self.files = tls_files(home, identity)
        # The agent plane's TLS; renewed with the certificate (trust/renewal.py).
        self.tls = presenting_server(self.files.cert, self.files.key, self.files.ca)
        self.advertiser: Advertiser | None = None  # while the node runs, with discovery on
        self.anchor = HeadAnchor.for_home(home)
        self.audit = AuthorityStore(home.database, anchor=self.anchor)
        self.denials = DenialLog(self.audit, settings.audit.denial_interval_s)
        self.reload_requested = False
        self.gpus = gpu_probe(settings.hardware.fake_gpus)
        self.firewall = FirewallProbe()
        agent = settings.agent
        self._report_now = asyncio.Event()
        self.supervisor = EngineSupervisor(
            home.engine_logs,
            home.engine_run,
            SupervisionPolicy.from_settings(settings),
            self.engine_changed,
        )
        # Engines listen on this node's data address, for the main's gateway only.
        release_pub = (
            home.cluster_dir(identity.cluster) / "release.pub" if identity.cluster else None
        )
        cluster_key = (
            release_pub.read_text().strip() if release_pub and release_pub.exists() else None
        )
        self.placements = PlacementRunner(
            home.model_store,
            home.engine_run,
            self.supervisor,
            advertise_address(agent.api_host, agent.advertise),
            lambda pg, why: log.warning("placement group %s failed: %s", pg, why),
            trusted=runtime.trusted_for(home, settings.release.trusted_keys, cluster_key),
            ports=(settings.engine.port_first, settings.engine.port_last),
        )
        self.server: Any = None  # the uvicorn server, set by the runner
        self.desired: list[DesiredPlacement] = []  # as the main last said
        self.links: LinkProber | None = None
        if identity.enrolled and self.files.ca is not None:
            self.links = LinkProber(
                identity.node_id,
                presenting_client(self.files.ca, self.files.cert, self.files.key),
                settings.links.probe_timeout_s,
            )
        self._mtime = home.identity_file.stat().st_mtime_ns
        self.revoked = self._load_revoked()
        # Set when the main said it removed this node (its notice or its refusal).
        self._removal: asyncio.Future[int] | None = None
        self._removal_began = 0.0  # (monotonic) a report sent before it is answered from before
        # Every group the main placed here, running or stopped (its last word).
        self.groups: list[dict[str, Any]] | None = None
        self._reported = asyncio.Event()
        self._main_answering = True  # the last report got the main's 200
        # Reports whose facts were built, and the last of them that went out:
        # report_soon waits for one built after its call, not one in flight.
        self._built = self._sent = 0

    def app(self) -> Any:
        return create_agent_app(
            self.home,
            lambda: self.identity,
            lambda: self.tls.fingerprint,
            self.audit,
            self.denials,
            lifespan=self.lifespan,
            revoked=lambda fp: fp in self.revoked,
            on_removed=self.removed,
            on_report_now=self.report_now,
        )

    def report_now(self) -> None:
        """Send facts early (bounded by EARLY_REPORT_GAP_S), without waiting:
        the main placed work here, or an engine changed state."""
        self._report_now.set()

    def engine_changed(self, status: EngineStatus) -> None:
        """A runner's state changed (starting, ready, restarting, failed,
        parked, stopped): the main hears it now, not at the next heartbeat, so
        a load it waits on is routed as soon as its engine is ready. Not while
        the main sheds or misses reports: then the paced wait stands (engines
        changing state across a fleet must not add load to a busy main)."""
        if self._main_answering:
            self.report_now()

    async def removed(self, by: str) -> int:
        """The main removed this node: stop every engine now (the main no longer
        routes to them). Said by the main on the agent plane, or by its refusal
        of this node's facts. Returns how many engines were stopped."""
        # The main's notice and its refusal of a report can both arrive: the
        # second waits for the first and gets the same count, not zero.
        removal = self._removal
        if removal is None or (
            removal.done() and (removal.cancelled() or removal.exception() is not None)
        ):  # (a removal that failed is tried again)
            self._removal_began = time.monotonic()
            removal = self._removal = asyncio.ensure_future(self._stop_for_removal(by))
        return await asyncio.shield(removal)

    async def _stop_for_removal(self, by: str) -> int:
        self.desired = []
        engines = len(self.supervisor.runners)
        self.placements.apply([])
        # Closed, not only emptied: a model still downloading from the main is
        # dropped at once (the main waits for this answer), and nothing starts
        # again on this identity.
        await self.placements.close()
        log.warning("the main removed this node; %d engine(s) stopped", engines)
        try:
            self.audit.append_audit(
                by,
                "node.removed",
                "ok",
                target=self.identity.name,
                detail=f"removed by the main at {self.identity.main_address}; "
                f"{engines} engine(s) stopped",
            )
        except Exception:  # (a full disk: the engines are stopped all the same)
            log.exception("cannot audit this node's removal")
        return engines

    def _answered_before_removal(self, sent: float) -> bool:
        """Whether a report's 200 may be from before the main removed this node:
        sent before the removal began (the main answered it before committing),
        or answered while the engines are being stopped."""
        removal = self._removal
        return removal is not None and (not removal.done() or sent <= self._removal_began)

    def engines(self) -> list[dict[str, Any]]:
        """The engines this agent runs right now (starting, ready or restarting)."""
        return [
            {"pg_id": pg_id, "state": runner.status.state}
            for pg_id, runner in self.supervisor.runners.items()
            if runner.status.state in ("starting", "ready", "restarting")
        ]

    def _engine_groups(self) -> set[str]:
        return {pg for pg, r in self.supervisor.runners.items() if r.pid is not None}

    async def report_soon(self, timeout: float = 10.0) -> None:
        """Send facts now (not at the next interval) and wait until a report
        built after this call (a report in flight has older facts) has had its
        answer, whatever it was: a main that cannot take it does not hold the
        caller, which gets on after its next report or ``timeout``."""
        after = self._built
        self._report_now.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._sent <= after:
                    self._reported.clear()
                    await self._reported.wait()

    def _load_revoked(self) -> frozenset[str]:
        """What the main last said it revoked: kept across restarts, so a removed
        node is refused even before this node reaches the main again."""
        try:
            return frozenset(json.loads(self.home.revoked_certificates.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return frozenset()

    def _set_revoked(self, fingerprints: list[str]) -> None:
        new = frozenset(fingerprints)
        if new == self.revoked:
            return
        path = self.home.revoked_certificates
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(new)))
        tmp.replace(path)
        self.revoked = new

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        agent = self.settings.agent
        adv = None
        if self.settings.discovery.enabled:
            fingerprint = self.tls.fingerprint
            adv = advertiser_for(self.identity, fingerprint, agent.api_host, agent.api_port)
            await adv.start()
            self.advertiser = adv
        admin = AdminPlane(
            self.home.admin_socket, LocalGate(self._admin_app(), self.denials, os.geteuid())
        )
        await admin.start()
        self.anchor.advance(self.audit)  # records appended without the key
        # Engines a previous run left serving, reported ready with the first facts.
        await self.placements.adopt_running()
        tasks = [
            asyncio.create_task(self._watch_identity(), name="identity watch"),
            asyncio.create_task(self.denials.run(), name="denial log"),
        ]
        if self.identity.role == "child":
            tasks.append(asyncio.create_task(self._report(), name="facts reports"))
            tasks.append(asyncio.create_task(self._prove_links(), name="link proofs"))
        log.info(
            "%s node %s (%s) agent on %s:%d",
            self.identity.role,
            self.identity.name,
            self.identity.node_id,
            agent.api_host,
            agent.api_port,
        )
        try:
            yield
        finally:
            try:
                await end_tasks(tasks)
                if adv is not None:
                    self.advertiser = None
                    await adv.stop()
                await admin.stop()
            finally:  # whatever failed above, no engine outlives the node
                await stop_engines(self.home, self.placements)
                self.audit.close()

    def _admin_app(self) -> Any:
        """What the CLI on this machine may ask its running child node: to pause
        or resume it, which the agent asks the main with the node's own key
        (so the CLI needs no access to the key)."""
        app = typed_app("letsinfer admin socket")

        @app.post("/v1/local/pause")
        async def pause(body: LocalPause, request: Request) -> dict[str, Any]:
            ident = self.identity
            if ident.role != "child":
                raise HTTPException(409, "this node is not enrolled in a cluster yet")
            client = ClusterClient(self.files, expect_node=ident.main_id)
            try:
                resp = await client.arequest(
                    "POST",
                    f"https://{ident.main_address}/v1/agent/pause",
                    json={"paused": body.paused},
                )
            except (httpx.HTTPError, PeerMismatch, OSError) as exc:
                raise HTTPException(
                    502, f"cannot reach the main at {ident.main_address}: {exc}"
                ) from exc
            if resp.status_code != 200:
                raise HTTPException(502, f"the main refused: {resp.text}")
            who = request.scope["state"]["peer"].identity.id
            self.audit.append_audit(
                f"local:{who}",
                "node.pause" if body.paused else "node.resume",
                "ok",
                target=ident.name,
                detail=f"asked the main at {ident.main_address}",
            )
            return {"node": ident.name, "paused": body.paused, "main": ident.main_address}

        app.include_router(
            storage_router(
                self.home,
                lambda: self.identity.name,
                lambda: child_uses(self.home, self.groups, self._engine_groups()),
                self.audit,
                self.report_soon,
            )
        )

        @app.get("/v1/local/work")
        async def work() -> dict[str, Any]:
            """This node's work before a move: the main's word and the live engines."""
            ident = self.identity
            main, why = None, None
            if ident.role == "child":
                client = ClusterClient(self.files, expect_node=ident.main_id, timeout=5.0)
                try:
                    resp = await client.arequest(
                        "GET", f"https://{ident.main_address}/v1/agent/work"
                    )
                except (httpx.HTTPError, PeerMismatch, OSError) as exc:
                    why = f"unreachable at {ident.main_address}: {exc}"
                else:
                    if resp.status_code == 200:
                        main = resp.json()["placement_groups"]
                    else:
                        why = f"it refused: {error_message(resp)}"
            return ChildWork(main, why, self.engines()).to_json()

        return app

    async def _watch_identity(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                mtime = self.home.identity_file.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            if mtime != self._mtime:
                log.info("node identity changed; restarting the agent planes")
                self.reload_requested = True
                if self.server is not None:
                    self.server.should_exit = True
                return

    async def _engine_loads(self, timeout_s: float) -> dict[str, EngineLoad]:
        """Free slots and queue depth of each ready engine that serves its group."""
        keys = {d.pg_id: d.engine_key for d in self.desired if d.task == "0"}
        serving = [
            (pg_id, runner.status.base_url, keys[pg_id])
            for pg_id, runner in self.supervisor.runners.items()
            if runner.status.state == "ready" and runner.status.base_url and pg_id in keys
        ]
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            return await read_loads(client, serving)

    def _facts(self, seq: int, loads: dict[str, EngineLoad] | None = None) -> Facts:
        engine = self.settings.engine
        placements = []
        loads = loads or {}
        for pg_id, runner in self.supervisor.runners.items():
            st = runner.status
            load = loads.get(pg_id, EngineLoad())
            placements.append(
                PlacementFact(
                    pg_id=pg_id,
                    task=self.placements.tasks.get(pg_id, "0"),
                    state=st.state,
                    base_url=st.base_url,
                    pid=st.pid,
                    restarts=st.restarts,
                    detail=(st.detail or "")[:500] or None,
                    capacity=engine.parallel if st.state == "ready" else None,
                    generation=self.placements.generations.get(pg_id, 0),
                    slots_free=load.slots_free,
                    queue_depth=load.queue_depth,
                    adapters=list(self.placements.adapter_names(pg_id)),
                    adapter_digests=[dg for _, dg in self.placements.adapters.get(pg_id, ())],
                )
            )
        for pg_id, why in self.placements.refused.items():
            if pg_id not in self.supervisor.runners:  # refused before it had an engine
                placements.append(
                    PlacementFact(
                        pg_id=pg_id,
                        task=self.placements.tasks.get(pg_id, "0"),
                        state="failed",
                        detail=why[:500],
                        generation=self.placements.generations.get(pg_id, 0),
                    )
                )
        host = host_facts(self.gpus)
        return Facts(
            node_id=self.identity.node_id,
            seq=seq,
            ts=time.time(),
            cpus=host["cpus"],
            memory_bytes=host["memory_bytes"],
            memory_available=host["memory_available"],
            targets=host["targets"],
            gpus=[GpuFact(**g) for g in host["gpus"]],
            placements=placements,
            links=self.links.facts() if self.links else [],
            version=__version__,
            audit=self._audit_head(),
            artifacts=present_digests(self.home.model_store),
            firewall=self.firewall.loaded(),
        )

    def _audit_head(self) -> AuditHeadFact | None:
        """This node's signed audit head for the main to witness, with what the
        O(1) check against the database finds wrong (a cut or rewritten chain)."""
        try:
            report = head_report(self.anchor, self.audit)
        except Exception:  # the report must go out even when the chain cannot be read
            log.exception("could not read the audit chain's head")
            return None
        if report is None:
            return None
        if report["problem"]:
            report["problem"] = report["problem"][:512]
        return AuditHeadFact(**report)

    async def _prove_links(self) -> None:
        """Prove, every interval, the data link to each peer this node's tasks need."""
        if self.links is None:
            return
        interval = self.settings.links.probe_interval_s
        while True:
            peers = [p for d in self.desired for p in d.peers]
            try:
                await self.links.probe(peers)
            except Exception:  # a probe bug must not end the loop
                log.exception("link probing failed")
            await asyncio.sleep(interval)

    async def _report(self) -> None:
        """Signed facts up, desired placements down, every interval, over one
        kept-alive connection; slower, spread, when the main is busy or
        unreachable (agent/pacing.py)."""
        ident = self.identity
        interval = self.settings.control.heartbeat_interval_s
        client = ClusterClient(
            self.files, expect_node=ident.main_id, keepalive_s=keepalive_s(interval)
        )
        key = pki.read_private_key(self.files.key)
        url = f"https://{ident.main_address}/v1/agent"
        engine = self.settings.engine
        pacing = ReportPacing(interval)
        refused = False
        seq = 0
        try:
            while True:
                try:
                    loads = await self._engine_loads(min(1.0, interval))
                except Exception:  # the facts go out without them
                    log.exception("could not read the engines' load")
                    loads = {}
                # Milliseconds since the epoch: still increasing after a restart.
                seq = max(seq + 1, int(time.time() * 1000))
                sent = time.monotonic()
                self._built += 1
                built = self._built
                answered = False
                try:
                    resp = await client.arequest(
                        "POST", url + "/facts", json=sign(self._facts(seq, loads), key)
                    )
                    if resp.status_code == 200 and self._answered_before_removal(sent):
                        # An answer from before the removal committed: its
                        # placements would start again what the removal stopped
                        # (it may arrive after the engines are stopped, on a slow main).
                        wait = pacing.answered()
                    elif resp.status_code == 200:
                        wait = pacing.answered()
                        answered = True
                        refused = False
                        self._removal = None
                        desired = [
                            from_wire(d, engine.threads, engine.context, engine.parallel)
                            for d in resp.json()["placements"]
                        ]
                        self.desired = desired
                        self._set_revoked(resp.json().get("revoked", []))
                        groups = resp.json().get("groups")
                        if isinstance(groups, list):
                            self.groups = groups
                            save_groups(self.home, groups)
                        self.placements.apply(desired, fetch=self._fetcher(client, url))
                        await self._renew_if_due(client, url)
                    elif resp.status_code == 503:
                        asked = retry_after(resp)
                        wait = pacing.busy(asked)
                        log.info(
                            "the main at %s is busy (503, Retry-After %s): next report in %.2fs",
                            ident.main_address,
                            f"{asked:g}s" if asked is not None else "not given",
                            wait,
                        )
                    else:
                        wait = pacing.refused()
                        if error_code(resp) == NODE_REMOVED:
                            await self.removed(f"main:{ident.main_id}")
                        if not refused:
                            log.error("the main refused this node: %s", resp.text)
                        refused = True
                except (httpx.HTTPError, PeerMismatch, OSError) as exc:
                    wait = pacing.failed()
                    log.warning(
                        "reporting to the main at %s failed: %s; next report in %.1fs",
                        ident.main_address,
                        str(exc) or type(exc).__name__,
                        wait,
                    )
                except Exception:  # its facts could not be built: say so, keep reporting
                    wait = pacing.failed()
                    log.exception("cannot build this node's facts; next report in %.1fs", wait)
                self._sent = built
                self._main_answering = answered
                self._reported.set()
                early = False
                with contextlib.suppress(TimeoutError):
                    early = await asyncio.wait_for(self._report_now.wait(), wait)
                if early:  # what asks for a report meanwhile goes with this one
                    await asyncio.sleep(early_report_wait(time.monotonic() - sent, interval))
                self._report_now.clear()
        finally:
            await client.aclose()

    def _fetcher(self, client: ClusterClient, url: str) -> Fetch:
        async def fetch(digest: str) -> None:
            dest = artifact_path(self.home.model_store, digest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            async with client.async_client(timeout=None) as http:
                await fetch_artifact(http, url, digest, dest)
            log.info("fetched model sha256:%s from the main", digest[:12])

        return fetch

    async def _renew_if_due(self, client: ClusterClient, url: str) -> None:
        if not renewal.due(self.files, self.settings.control.renew_certificates_before_s):
            return
        key = pki.read_private_key(self.files.key)
        resp = await client.arequest(
            "POST", url + "/renew", json={"csr": pki.make_csr(key, self.identity.node_id).decode()}
        )
        if resp.status_code != 200:
            log.warning("the main refused to renew this node's certificate: %s", resp.text[:200])
            return
        try:
            new = renewal.install(self.files, resp.json()["certificate"].encode())
        except (pki.CertificateError, KeyError, ValueError) as exc:
            log.error("the renewed certificate from the main was not installed: %s", exc)
            return
        if self.advertiser is not None:
            await self.advertiser.update_fingerprint(self.tls.fingerprint)
        log.info("node certificate renewed until %s", new.not_valid_after_utc)
