"""Keeping this node's engines equal to the placements it should run.

The same code serves the main's own engines (desired state read from the
authority) and a child's (desired state received from the main). Safe to run
as often as wanted: it only starts what is missing and stops what is extra.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from letsinfer.agent.ports import free_port
from letsinfer.agent.supervisor import EngineSupervisor, LaunchRefused
from letsinfer.contracts.artifacts import ModelFileError, artifact_path, verify_artifact
from letsinfer.contracts.placement import DesiredPlacement
from letsinfer.engines.binary import BinaryError
from letsinfer.engines.launch import EngineTask, LaunchPlan, plan_llamacpp
from letsinfer.engines.parallel_command import plan_parallel_command
from letsinfer.engines.releases import check_binary
from letsinfer.release import runtime
from letsinfer.release.keys import PublicKey
from letsinfer.release.signatures import TrustError

log = logging.getLogger("letsinfer.agent")

Fetch = Callable[[str], Awaitable[None]]  # digest -> places the verified artifact


@dataclass
class PlacementRunner:
    model_store: Path
    run_dir: Path
    supervisor: EngineSupervisor
    host: str
    on_failed: Callable[[str, str], None]  # (pg id, why)
    trusted: list[PublicKey] = field(default_factory=list)  # release signers
    # Where engines on a data address listen ([engine] port_first..port_last), so
    # the firewall can keep them to the main; None: any free port (loopback).
    ports: tuple[int, int] | None = None
    services: dict[str, str] = field(default_factory=dict)  # pg id -> model service
    tasks: dict[str, str] = field(default_factory=dict)  # pg id -> the task run here
    # Wanted but not started, with why (reported as failed; tried again each apply).
    refused: dict[str, str] = field(default_factory=dict)
    _wanted: set[str] = field(default_factory=set)
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    _verified: set[str] = field(default_factory=set)
    _fetching: set[str] = field(default_factory=set)

    def apply(self, desired: list[DesiredPlacement], fetch: Fetch | None = None) -> None:
        wanted = {d.pg_id: d for d in desired}
        self._wanted = set(wanted)
        for pg_id in set(self.refused) - self._wanted:
            del self.refused[pg_id]
        for pg_id in set(self.supervisor.runners) - set(wanted):
            self._spawn(self.supervisor.stop(pg_id))
        for d in wanted.values():
            if d.pg_id in self.supervisor.runners:
                continue
            if not artifact_path(self.model_store, d.artifact_digest).exists() and fetch:
                if d.artifact_digest not in self._fetching:
                    self._fetching.add(d.artifact_digest)
                    self._spawn(self._fetch_then_start(d, fetch))
                continue
            self._start(d)

    async def stop_all(self) -> None:
        await self.supervisor.stop_all()
        await asyncio.gather(*self._background, return_exceptions=True)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _fetch_then_start(self, d: DesiredPlacement, fetch: Fetch) -> None:
        try:
            await fetch(d.artifact_digest)
        except Exception as exc:  # a failed download must be visible, and retried later
            log.warning("fetching sha256:%s failed: %s", d.artifact_digest[:12], exc)
            self._refuse(d.pg_id, f"model download failed: {exc}")
            return
        finally:
            self._fetching.discard(d.artifact_digest)
        self._start(d)

    def _refuse(self, pg_id: str, why: str) -> None:
        if self.refused.get(pg_id) != why:  # said once per reason, not every apply
            self.refused[pg_id] = why
            self.on_failed(pg_id, why)

    def _start(self, d: DesiredPlacement) -> None:
        if d.pg_id not in self._wanted:  # gone while its model was downloading
            return
        self.tasks[d.pg_id] = d.task
        try:
            runtime.verify(d.release, d.release_signature, self.trusted)
            check_binary(d.release)
        except (TrustError, BinaryError) as exc:
            self._refuse(d.pg_id, f"refused to run: {exc}")
            return
        try:
            if d.artifact_digest not in self._verified:
                verify_artifact(self.model_store, d.artifact_digest)
                self._verified.add(d.artifact_digest)
        except ModelFileError as exc:
            self._refuse(d.pg_id, str(exc))
            return
        model_path = artifact_path(self.model_store, d.artifact_digest)

        if d.release.engine == "vllm":
            # engines/vllm.py plans it (Ray head + vLLM serve, Ray workers); this
            # agent does not yet supervise a task made of several processes.
            self._refuse(d.pg_id, "refused to run: vLLM tasks are not supervised by agents yet")
            return

        def make_plan(port: int) -> LaunchPlan:
            try:  # again at every (re)start: the binary may change under a running engine
                check_binary(d.release)
            except BinaryError as exc:
                raise LaunchRefused(str(exc)) from exc
            task = EngineTask(
                pg_id=d.pg_id,
                model_name=d.service,
                model_path=model_path,
                host=self.host,
                port=port,
                engine_key=d.engine_key,
                gpu_uuids=d.gpu_uuids,
                threads=d.threads,
                context=d.context,
                parallel=d.parallel,
            )
            if d.release.engine == "parallel-command":
                return plan_parallel_command(d.release, task, d.task, d.group, d.group_key or "")
            return plan_llamacpp(d.release, task, self.run_dir)

        self.services[d.pg_id] = d.service
        self.refused.pop(d.pg_id, None)
        fixed = d.port
        self.supervisor.ensure(
            d.pg_id,
            make_plan,
            (lambda: fixed) if fixed else (lambda: free_port(self.host, self.ports)),
        )
