"""Engine supervision: one process per placement-group task.

Starts the engine on a free port, waits for ``/health`` and its proof (one
real answer, engines/proof.py), watches it (exit and health probes), restarts
with exponential backoff after a crash, and stops it with SIGTERM then
SIGKILL. An engine that fails to start N times in a row is parked: not
restarted again until its placement changes (``model start`` raises its
generation), with its own last error lines as the reason.

Engines outlive this process. Each runs in its own session (a terminal's
Ctrl-C reaches only the node, which stops its engines in order), holds a lease
this supervisor renews (engines/lease.py) and has a launch record
(agent/reattach.py). A node that restarts hands its ready engines over: it
leaves them running, and the next start adopts those it proves are its own. A
node that stops stops them; a node killed outright leaves them to stop
themselves when their lease runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

from letsinfer.agent import reattach
from letsinfer.agent.processes import AdoptedProcess, EngineProcess, SpawnedProcess
from letsinfer.config import Settings
from letsinfer.engines import lease
from letsinfer.engines.diagnosis import error_lines, log_since, log_size
from letsinfer.engines.launch import LaunchPlan
from letsinfer.engines.proof import ProofRequest, prove

log = logging.getLogger("letsinfer.agent")

_STABLE_AFTER_S = 30.0  # a run this long resets the backoff
# /health is asked this often while an engine starts: a request may be
# waiting for it (a load on demand), and each look costs a refused connect.
_READY_POLL_S = 0.02
_UNHEALTHY_PROBES = 3
# A binary we did not write cannot watch its lease: it runs under a keeper.
_KEEPER = [sys.executable, "-m", "letsinfer.engines.keeper", "--"]


@dataclass(frozen=True)
class EngineStatus:
    pg_id: str
    state: str  # starting, ready, restarting, failed, parked, stopped
    base_url: str | None = None
    pid: int | None = None
    port: int | None = None
    restarts: int = 0
    detail: str | None = None


@dataclass(frozen=True)
class EngineIdentity:
    """What an engine's launch record binds it to (see agent/reattach.py)."""

    pg_id: str
    task: str
    service: str
    placement: str  # fingerprint of the desired placement
    release_id: str
    engine_key: str | None  # None for a task that serves no API


PlanFactory = Callable[[int], LaunchPlan]  # port -> plan; may raise LaunchRefused


class LaunchRefused(Exception):
    """The node will not run this plan (e.g. its binary is not the released
    one): the engine is marked failed with the reason and not restarted."""


StatusSink = Callable[[EngineStatus], None]


@dataclass(frozen=True)
class SupervisionPolicy:
    ready_timeout_s: float = 120.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    health_interval_s: float = 2.0
    stop_grace_s: float = 5.0
    lease_grace_s: float = 60.0  # an engine nobody renews stops itself after this
    park_after_failed_starts: int = 5  # 0: restart for ever

    @classmethod
    def from_settings(cls, settings: Settings) -> SupervisionPolicy:
        agent = settings.agent
        return cls(
            ready_timeout_s=settings.engine.ready_timeout_s,
            backoff_initial_s=agent.restart_backoff_initial_s,
            backoff_max_s=agent.restart_backoff_max_s,
            health_interval_s=agent.health_interval_s,
            lease_grace_s=agent.orphan_grace_s,
            park_after_failed_starts=agent.park_after_failed_starts,
        )

    @property
    def lease_renew_s(self) -> float:
        return min(2.0, self.lease_grace_s / 4)


class EngineRunner:
    """Keeps one engine process alive until stopped or handed over."""

    def __init__(
        self,
        identity: EngineIdentity,
        log_path: Path,
        run_dir: Path,
        policy: SupervisionPolicy,
        sink: StatusSink,
    ) -> None:
        self.pg_id = identity.pg_id
        self.identity = identity
        self._make_plan: PlanFactory | None = None
        self._port_for: Callable[[], int] | None = None
        self._log_path = log_path
        self._run_dir = run_dir
        self._policy = policy
        self._sink = sink
        self._stopping = asyncio.Event()
        self._planned = asyncio.Event()
        self._handing_over = False
        self._proc: EngineProcess | None = None
        self._task: asyncio.Task[None] | None = None
        self.lease: Path | None = None  # renewed by the supervisor while a process runs
        self.restarts = 0
        self.status = EngineStatus(self.pg_id, "starting")
        self._ready_once = False  # this start reached ready (proven)

    def plan(
        self, identity: EngineIdentity, make_plan: PlanFactory, port_for: Callable[[], int]
    ) -> None:
        self.identity = identity
        self._make_plan = make_plan
        self._port_for = port_for
        self._planned.set()

    @property
    def planned(self) -> bool:
        return self._planned.is_set()

    def start(self, adopted: tuple[AdoptedProcess, reattach.LaunchRecord] | None = None) -> None:
        self._task = asyncio.create_task(self._run(adopted), name=f"engine-{self.pg_id}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.running else None

    def _publish(self, **fields: object) -> None:
        self.status = EngineStatus(pg_id=self.pg_id, restarts=self.restarts, **fields)  # type: ignore[arg-type]
        self._sink(self.status)

    async def _run(self, adopted: tuple[AdoptedProcess, reattach.LaunchRecord] | None) -> None:
        failures = 0
        failed_starts = 0  # in a row, never ready: parks the engine at the limit
        async with httpx.AsyncClient(timeout=2.0) as probe:
            if adopted is not None:
                proc, record = adopted
                self._proc = proc
                self.lease = reattach.lease_path(self._run_dir, record.pg_id, record.task)
                reason = await self._supervise(proc, record.base_url, record.port, probe, False)
                if not self._stopping.is_set():
                    self.restarts += 1
                    log.warning("engine %s: %s; starting a new one", self.pg_id, reason)
                    self._publish(state="restarting", detail=reason)
            while not self._stopping.is_set():
                if not self._planned.is_set():  # adopted before its placement was known
                    await _first(self._planned, self._stopping)
                    continue
                assert self._make_plan is not None and self._port_for is not None
                port = self._port_for()
                try:
                    plan = self._make_plan(port)
                except LaunchRefused as exc:
                    log.error("engine %s: %s", self.pg_id, exc)
                    self._publish(state="failed", detail=f"refused to run: {exc}")
                    await self._stopping.wait()  # until the placement goes away
                    break
                self._publish(state="starting", port=port)
                started = time.monotonic()
                offset = log_size(self._log_path)
                self._ready_once = False
                try:
                    reason = await self._run_once(plan, port, probe)
                except Exception as exc:  # a launch error must not end supervision
                    log.exception("engine %s: launch failed", self.pg_id)
                    reason = f"launch failed: {exc}"
                if self._stopping.is_set():
                    break
                failed_starts = 0 if self._ready_once else failed_starts + 1
                limit = self._policy.park_after_failed_starts
                if limit and failed_starts >= limit:
                    said = error_lines(log_since(self._log_path, offset))
                    why = f"{reason}: {said}" if said else reason
                    log.error(
                        "engine %s: parked after %d failed starts: %s", self.pg_id, limit, why
                    )
                    self._publish(state="parked", detail=f"{limit} failed starts; last: {why}")
                    await self._stopping.wait()  # until its placement changes or goes
                    break
                failures = 0 if time.monotonic() - started > _STABLE_AFTER_S else failures + 1
                delay = (
                    min(
                        self._policy.backoff_initial_s * 2 ** (failures - 1),
                        self._policy.backoff_max_s,
                    )
                    if failures
                    else self._policy.backoff_initial_s
                )
                self.restarts += 1
                log.warning("engine %s: %s; restarting in %.1fs", self.pg_id, reason, delay)
                self._publish(state="restarting", detail=f"{reason}; restarting in {delay:.1f}s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        if not self._handing_over:  # a handed-over engine goes on serving
            self._publish(state="stopped")

    async def _run_once(self, plan: LaunchPlan, port: int, probe: httpx.AsyncClient) -> str:
        for path, content in plan.files.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(content)
        ident = self.identity
        nonce = reattach.new_nonce()
        lease_file = reattach.lease_path(self._run_dir, ident.pg_id, ident.task)
        lease.renew(lease_file)
        argv = plan.argv if plan.own_lease else [*_KEEPER, *plan.argv]
        env = {
            **os.environ,
            **plan.env,
            reattach.NONCE_ENV: nonce,
            lease.LEASE_ENV: str(lease_file),
            lease.GRACE_ENV: str(self._policy.lease_grace_s),
        }
        with self._log_path.open("ab") as logf:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # not the node's process group: it outlives the node
            )
        self._proc = SpawnedProcess(proc)
        self.lease = lease_file
        ticks = reattach.start_ticks(proc.pid)
        if ticks is not None:
            reattach.write_record(
                reattach.record_path(self._run_dir, ident.pg_id, ident.task),
                reattach.LaunchRecord(
                    pg_id=ident.pg_id,
                    task=ident.task,
                    service=ident.service,
                    placement=ident.placement,
                    release_id=ident.release_id,
                    base_url=plan.base_url,
                    port=port,
                    pid=proc.pid,
                    start_ticks=ticks,
                    boot_id=reattach.boot_id(),
                    uid=os.geteuid(),
                    argv=argv,
                    nonce=nonce,
                    engine_key=ident.engine_key,
                ),
            )
        return await self._supervise(self._proc, plan.base_url, port, probe, plan.proof)

    async def _supervise(
        self,
        proc: EngineProcess,
        base_url: str,
        port: int,
        probe: httpx.AsyncClient,
        proof: ProofRequest | Literal[False] | None,
    ) -> str:
        """Wait until the engine is healthy and proven (``proof``; None: health
        only; False: adopted, known ready), then watch it."""
        health = base_url + "/health"
        exited = asyncio.create_task(proc.wait())
        try:
            unready = (
                None
                if proof is False
                else await self._wait_ready(health, base_url, proof, probe, exited)
            )
            if unready is not None:
                if exited.done():
                    return f"engine exited with code {exited.result()} before it was ready"
                await self._terminate()
                return unready
            self._ready_once = True
            self._publish(state="ready", base_url=base_url, pid=proc.pid, port=port)
            return await self._watch(health, probe, exited)
        finally:
            kept = self._handing_over and self.status.state == "ready" and proc.running
            if not kept:
                if self._stopping.is_set() or not exited.done():
                    await self._terminate()
                reattach.remove(self._run_dir, self.identity.pg_id, self.identity.task)
            exited.cancel()
            proc.close()
            self._proc = None
            self.lease = None

    async def _wait_ready(
        self,
        health: str,
        base_url: str,
        proof: ProofRequest | None,
        probe: httpx.AsyncClient,
        exited: asyncio.Task[int | None],
    ) -> str | None:
        """None once healthy and proven; otherwise why not."""
        deadline = time.monotonic() + self._policy.ready_timeout_s
        while time.monotonic() < deadline and not exited.done() and not self._stopping.is_set():
            with contextlib.suppress(httpx.HTTPError):
                if (await probe.get(health)).status_code == 200:
                    if proof is None:
                        return None
                    left = max(deadline - time.monotonic(), 1.0)
                    failed = await prove(probe, base_url, proof, left)
                    return None if failed is None else f"engine not proven: {failed}"
            await asyncio.wait({exited}, timeout=_READY_POLL_S)
        return f"engine not ready after {self._policy.ready_timeout_s:.0f}s"

    async def _watch(
        self, health: str, probe: httpx.AsyncClient, exited: asyncio.Task[int | None]
    ) -> str:
        misses = 0
        stop = asyncio.create_task(self._stopping.wait())
        try:
            while True:
                done, _ = await asyncio.wait(
                    {exited, stop},
                    timeout=self._policy.health_interval_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if exited in done:
                    code = exited.result()
                    return "engine exited" + (f" with code {code}" if code is not None else "")
                if stop in done:
                    return "stopped"
                try:
                    ok = (await probe.get(health)).status_code == 200
                except httpx.HTTPError:
                    ok = False
                misses = 0 if ok else misses + 1
                if misses >= _UNHEALTHY_PROBES:
                    await self._terminate()
                    return f"engine failed {misses} health checks"
        finally:
            stop.cancel()

    async def _terminate(self) -> None:
        proc = self._proc
        if proc is None or not proc.running:
            return
        proc.send(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=self._policy.stop_grace_s)
        except TimeoutError:
            proc.send(signal.SIGKILL)
            await proc.wait()

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task

    async def hand_over(self) -> bool:
        """Stop supervising; a ready engine keeps running (True), any other is stopped."""
        self._handing_over = self.status.state == "ready"
        await self.stop()
        return self._handing_over


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class EngineSupervisor:
    """All engines of this node, keyed by placement group."""

    def __init__(
        self, log_dir: Path, run_dir: Path, policy: SupervisionPolicy, sink: StatusSink
    ) -> None:
        self._log_dir = log_dir
        self.run_dir = run_dir
        self._policy = policy
        self._sink = sink
        self.runners: dict[str, EngineRunner] = {}
        self._leases: asyncio.Task[None] | None = None

    def _runner(self, identity: EngineIdentity) -> EngineRunner:
        runner = EngineRunner(
            identity,
            self._log_dir / f"{identity.pg_id}.log",
            self.run_dir,
            self._policy,
            self._sink,
        )
        self.runners[identity.pg_id] = runner
        if self._leases is None or self._leases.done():
            self._leases = asyncio.create_task(self._keep_leases(), name="engine-leases")
        return runner

    def ensure(
        self, identity: EngineIdentity, make_plan: PlanFactory, port_for: Callable[[], int]
    ) -> EngineRunner:
        runner = self.runners.get(identity.pg_id)
        if runner is None:
            runner = self._runner(identity)
            runner.plan(identity, make_plan, port_for)
            runner.start()
        elif not runner.planned:  # adopted at start: now it may be restarted too
            runner.plan(identity, make_plan, port_for)
        return runner

    def adopt(self, record: reattach.LaunchRecord, proc: AdoptedProcess) -> EngineRunner:
        """Supervise an engine a previous run of this node launched (proven its own)."""
        identity = EngineIdentity(
            record.pg_id,
            record.task,
            record.service,
            record.placement,
            record.release_id,
            record.engine_key,
        )
        runner = self._runner(identity)
        runner.start(adopted=(proc, record))
        return runner

    async def _keep_leases(self) -> None:
        while True:
            for runner in list(self.runners.values()):
                if runner.lease is not None:
                    with contextlib.suppress(OSError):
                        lease.renew(runner.lease)
            await asyncio.sleep(self._policy.lease_renew_s)

    async def _stop_leases(self) -> None:
        if self._leases is not None:
            self._leases.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._leases
            self._leases = None

    async def stop(self, pg_id: str) -> None:
        runner = self.runners.pop(pg_id, None)
        if runner is not None:
            await runner.stop()

    async def stop_all(self) -> None:
        runners = list(self.runners.values())
        self.runners.clear()
        await asyncio.gather(*(r.stop() for r in runners), return_exceptions=True)
        await self._stop_leases()

    async def hand_over(self) -> int:
        """Leave every ready engine running for the next start of this node to
        adopt (stop the others); returns how many were left running."""
        leases = [r.lease for r in self.runners.values() if r.lease is not None]
        runners = list(self.runners.values())
        self.runners.clear()
        await self._stop_leases()
        kept = await asyncio.gather(*(r.hand_over() for r in runners), return_exceptions=True)
        for path in leases:  # a full grace period for the next start, from now
            with contextlib.suppress(OSError):
                if path.exists():
                    lease.renew(path)
        return sum(1 for k in kept if k is True)
