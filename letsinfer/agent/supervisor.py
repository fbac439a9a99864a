"""Engine supervision: one child process per placement-group task.

Starts the engine on a free port, waits for ``/health`` and its proof (one
real answer, engines/proof.py), watches it (exit and health probes), restarts
with exponential backoff after a crash, and stops it with SIGTERM then
SIGKILL. An engine that fails to start N times in a row is parked: not
restarted again until its placement changes (``model start`` raises its
generation), with its own last error lines as the reason. Engines also get
PR_SET_PDEATHSIG, so they never outlive the node even if the node itself is
killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from letsinfer.config import Settings
from letsinfer.engines.diagnosis import error_lines, log_since, log_size
from letsinfer.engines.launch import LaunchPlan
from letsinfer.engines.proof import prove

log = logging.getLogger("letsinfer.agent")

_PR_SET_PDEATHSIG = 1
_STABLE_AFTER_S = 30.0  # a run this long resets the backoff
_UNHEALTHY_PROBES = 3


def _engine_child_setup() -> None:  # runs in the child between fork and exec
    # Own process group: a terminal's Ctrl-C reaches only the node, which then
    # stops its engines in order. Death signal: engines never outlive the node.
    os.setpgid(0, 0)
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class EngineStatus:
    pg_id: str
    state: str  # starting, ready, restarting, failed, parked, stopped
    base_url: str | None = None
    pid: int | None = None
    port: int | None = None
    restarts: int = 0
    detail: str | None = None


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
    park_after_failed_starts: int = 5  # 0: restart for ever

    @classmethod
    def from_settings(cls, settings: Settings) -> SupervisionPolicy:
        agent = settings.agent
        return cls(
            ready_timeout_s=settings.engine.ready_timeout_s,
            backoff_initial_s=agent.restart_backoff_initial_s,
            backoff_max_s=agent.restart_backoff_max_s,
            health_interval_s=agent.health_interval_s,
            park_after_failed_starts=agent.park_after_failed_starts,
        )


class EngineRunner:
    """Keeps one engine process alive until stopped."""

    def __init__(
        self,
        pg_id: str,
        make_plan: PlanFactory,
        port_for: Callable[[], int],
        log_path: Path,
        policy: SupervisionPolicy,
        sink: StatusSink,
    ) -> None:
        self.pg_id = pg_id
        self._make_plan = make_plan
        self._port_for = port_for
        self._log_path = log_path
        self._policy = policy
        self._sink = sink
        self._stopping = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self.restarts = 0
        self.status = EngineStatus(pg_id, "starting")
        self._ready_once = False  # this start reached ready (proven)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"engine-{self.pg_id}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.returncode is None else None

    def _publish(self, **fields: object) -> None:
        self.status = EngineStatus(pg_id=self.pg_id, restarts=self.restarts, **fields)  # type: ignore[arg-type]
        self._sink(self.status)

    async def _run(self) -> None:
        failures = 0
        failed_starts = 0  # in a row, never ready: parks the engine at the limit
        async with httpx.AsyncClient(timeout=2.0) as probe:
            while not self._stopping.is_set():
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
        self._publish(state="stopped")

    async def _run_once(self, plan: LaunchPlan, port: int, probe: httpx.AsyncClient) -> str:
        for path, content in plan.files.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(content)
        env = {**os.environ, **plan.env}
        with self._log_path.open("ab") as logf:
            self._proc = await asyncio.create_subprocess_exec(
                *plan.argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                preexec_fn=_engine_child_setup,
            )
        proc = self._proc
        exited = asyncio.create_task(proc.wait())
        try:
            unready = await self._wait_ready(plan, probe, exited)
            if unready is not None:
                if exited.done():
                    return f"engine exited with code {proc.returncode} before it was ready"
                await self._terminate()
                return unready
            self._ready_once = True
            self._publish(state="ready", base_url=plan.base_url, pid=proc.pid, port=port)
            return await self._watch(plan, probe, exited)
        finally:
            if self._stopping.is_set() or not exited.done():
                await self._terminate()
            exited.cancel()

    async def _wait_ready(
        self,
        plan: LaunchPlan,
        probe: httpx.AsyncClient,
        exited: asyncio.Task[int],
    ) -> str | None:
        """None once healthy and proven; otherwise why not."""
        deadline = time.monotonic() + self._policy.ready_timeout_s
        while time.monotonic() < deadline and not exited.done() and not self._stopping.is_set():
            with contextlib.suppress(httpx.HTTPError):
                if (await probe.get(plan.health_url)).status_code == 200:
                    if plan.proof is None:
                        return None
                    left = max(deadline - time.monotonic(), 1.0)
                    failed = await prove(probe, plan.base_url, plan.proof, left)
                    return None if failed is None else f"engine not proven: {failed}"
            await asyncio.wait({exited}, timeout=0.1)
        return f"engine not ready after {self._policy.ready_timeout_s:.0f}s"

    async def _watch(
        self, plan: LaunchPlan, probe: httpx.AsyncClient, exited: asyncio.Task[int]
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
                    return f"engine exited with code {exited.result()}"
                if stop in done:
                    return "stopped"
                try:
                    ok = (await probe.get(plan.health_url)).status_code == 200
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
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=self._policy.stop_grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task


class EngineSupervisor:
    """All engines of this node, keyed by placement group."""

    def __init__(self, log_dir: Path, policy: SupervisionPolicy, sink: StatusSink) -> None:
        self._log_dir = log_dir
        self._policy = policy
        self._sink = sink
        self.runners: dict[str, EngineRunner] = {}

    def ensure(
        self, pg_id: str, make_plan: PlanFactory, port_for: Callable[[], int]
    ) -> EngineRunner:
        runner = self.runners.get(pg_id)
        if runner is None:
            runner = EngineRunner(
                pg_id, make_plan, port_for, self._log_dir / f"{pg_id}.log", self._policy, self._sink
            )
            self.runners[pg_id] = runner
            runner.start()
        return runner

    async def stop(self, pg_id: str) -> None:
        runner = self.runners.pop(pg_id, None)
        if runner is not None:
            await runner.stop()

    async def stop_all(self) -> None:
        runners = list(self.runners.values())
        self.runners.clear()
        await asyncio.gather(*(r.stop() for r in runners), return_exceptions=True)
