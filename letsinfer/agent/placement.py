"""Keeping this node's engines equal to the placements it should run.

The same code serves the main's own engines (desired state read from the
authority) and a child's (desired state received from the main). Safe to run
as often as wanted: it only starts what is missing, stops what is extra, and
starts afresh an engine whose placement has a new generation (unparked,
another release, a rolling restart). At start it first adopts the engines a
previous run of this node left running (see agent/reattach.py); an adopted
engine whose placement is no longer wanted, or changed, is stopped like any
other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from letsinfer.agent import reattach
from letsinfer.agent.ports import free_port
from letsinfer.agent.supervisor import EngineIdentity, EngineSupervisor, LaunchRefused
from letsinfer.contracts.artifacts import ModelFileError, artifact_path, verify_artifact
from letsinfer.contracts.placement import DesiredPlacement
from letsinfer.engines.binary import BinaryError
from letsinfer.engines.launch import EngineTask, LaunchPlan, plan_llamacpp
from letsinfer.engines.parallel_command import plan_parallel_command
from letsinfer.engines.releases import check_binary
from letsinfer.engines.vllm import NOT_SUPERVISED
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
    # Where engines listen ([engine] port_first..port_last): the firewall keeps
    # those on a data address to the main; None: any port the kernel picks.
    ports: tuple[int, int] | None = None
    services: dict[str, str] = field(default_factory=dict)  # pg id -> model service
    tasks: dict[str, str] = field(default_factory=dict)  # pg id -> the task run here
    generations: dict[str, int] = field(default_factory=dict)  # pg id -> the one running
    # pg id -> the LoRA adapters its engine was launched with, (name, digest) in load order
    adapters: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    # Wanted but not started, with why (reported as failed; tried again each apply).
    refused: dict[str, str] = field(default_factory=dict)
    _wanted: set[str] = field(default_factory=set)
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    # digest -> the file's state when it was last hashed: a file rewritten since
    # (a new inode, size, modification or change time) is hashed again.
    _verified: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    _fetching: dict[str, asyncio.Future[None]] = field(default_factory=dict)  # digest: its download
    _restarting: set[str] = field(default_factory=set)
    _latest: dict[str, DesiredPlacement] = field(default_factory=dict)
    # Set when the node ends: no apply after it (a late report, a restart's second
    # half) starts anything; downloads are cancelled then.
    _closed: bool = False

    def _verify_files(self, d: DesiredPlacement) -> None:
        """Hash the model's and adapters' files, unless unchanged since they last
        matched their digests (hashing a model is slow; a stat is not)."""
        for digest in dict.fromkeys(d.digests()):
            path = artifact_path(self.model_store, digest)
            try:
                st = path.stat()
                seen = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            except OSError:
                seen = None
            if seen is None or self._verified.get(digest) != seen:
                verify_artifact(self.model_store, digest)  # (raises for a missing file)
                if seen is not None:
                    self._verified[digest] = seen

    def adapter_names(self, pg_id: str) -> tuple[str, ...]:
        """The adapters ``pg_id``'s engine loaded, by name: a request's adapter id
        is its place here."""
        return tuple(name for name, _ in self.adapters.get(pg_id, ()))

    async def adopt_running(self) -> int:
        """Adopt the engines a previous run of this node left running, those it
        proves are its own; drop every other record. Returns how many it adopted."""
        adopted = 0
        async with httpx.AsyncClient(timeout=5.0) as client:
            for found in reattach.read_records(self.run_dir):
                record = found.record
                if record is None:
                    log.warning("not adopting from %s: %s", found.path.name, found.problem)
                    found.path.unlink(missing_ok=True)
                    continue
                proven = await reattach.prove(record, client)
                if isinstance(proven, str):
                    # The lease goes too: an engine of ours that cannot be proven
                    # stops by itself; a process that is not ours is never signalled.
                    log.warning(
                        "not adopting the engine of %s (pid %d): %s; it gets a new engine",
                        record.pg_id,
                        record.pid,
                        proven,
                    )
                    reattach.remove(self.run_dir, record.pg_id, record.task)
                    continue
                log.info(
                    "adopted the running engine of %s (pid %d) at %s",
                    record.pg_id,
                    record.pid,
                    record.base_url,
                )
                self.services[record.pg_id] = record.service
                self.tasks[record.pg_id] = record.task
                self.supervisor.adopt(record, proven)
                adopted += 1
        return adopted

    async def hand_over(self) -> int:
        """The node restarts: leave ready engines running for the next start."""
        self._close()
        kept = await self.supervisor.hand_over()
        await asyncio.gather(*self._background, return_exceptions=True)
        return kept

    def apply(self, desired: list[DesiredPlacement], fetch: Fetch | None = None) -> None:
        if self._closed:
            return
        wanted = {d.pg_id: d for d in desired}
        self._wanted = set(wanted)
        self._latest = wanted
        for pg_id in set(self.refused) - self._wanted:
            del self.refused[pg_id]
        for pg_id in set(self.generations) - self._wanted - set(self.supervisor.runners):
            del self.generations[pg_id]
            self.adapters.pop(pg_id, None)
        for pg_id in set(self.supervisor.runners) - set(wanted):
            self._spawn(self.supervisor.stop(pg_id))
        for d in wanted.values():
            if d.pg_id in self._restarting:
                continue
            runner = self.supervisor.runners.get(d.pg_id)
            if runner is not None and not runner.planned:  # adopted, its placement now known
                if runner.identity.placement == d.fingerprint():
                    self._start(d, adopted=True)
                else:
                    log.info("the adopted engine of %s runs another placement: replacing", d.pg_id)
                    self._restarting.add(d.pg_id)
                    self._spawn(self._restart(d.pg_id, fetch))
                continue
            if runner is not None:
                # A new generation, or other adapters than it loaded (changed
                # while this node was unreachable: a name may now be another file).
                loads = _loaded(d)
                if (
                    self.generations.get(d.pg_id, d.generation) != d.generation
                    or self.adapters.get(d.pg_id, loads) != loads
                ):
                    self._restarting.add(d.pg_id)
                    self._spawn(self._restart(d.pg_id, fetch))
                continue
            if d.pg_id in self.refused and self.generations.get(d.pg_id) != d.generation:
                self.refused.pop(d.pg_id)  # a new generation: say it again if it fails again
            missing = [
                digest  # (once each: adapters may share a file)
                for digest in dict.fromkeys(d.digests())
                if not artifact_path(self.model_store, digest).exists()
            ]
            if missing and fetch:  # the model and its adapters come from the main
                if not any(digest in self._fetching for digest in missing):
                    download = self._spawn(self._fetch_then_start(d, missing, fetch))
                    self._fetching.update(dict.fromkeys(missing, download))
                continue
            self._start(d)

    async def stop_all(self) -> None:
        await self.supervisor.stop_all()
        await asyncio.gather(*self._background, return_exceptions=True)

    async def close(self) -> None:
        """The node ends: stop every engine, and start none after."""
        self._close()
        await self.stop_all()

    def _close(self) -> None:
        """Start nothing from now on; stop downloading (a stalled main must not
        hold up the node's end; the next start resumes from the partial files)."""
        self._closed = True
        for download in set(self._fetching.values()):
            download.cancel()

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _fetch_then_start(
        self, d: DesiredPlacement, digests: list[str], fetch: Fetch
    ) -> None:
        try:
            for digest in digests:
                try:
                    await fetch(digest)
                except Exception as exc:  # a failed download must be visible, and retried
                    log.warning("fetching sha256:%s failed: %s", digest[:12], exc)
                    what = "model" if digest == d.artifact_digest else "LoRA adapter"
                    self._refuse(d.pg_id, f"{what} download failed: {exc}")
                    return
        finally:
            for digest in digests:
                self._fetching.pop(digest, None)
        self._start(d)

    async def _restart(self, pg_id: str, fetch: Fetch | None) -> None:
        """Stop the engine, then start it as its latest placement says."""
        try:
            await self.supervisor.stop(pg_id)
        finally:
            self._restarting.discard(pg_id)
        if pg_id in self._wanted and pg_id not in self.supervisor.runners:
            self.apply(list(self._latest.values()), fetch)

    def _refuse(self, pg_id: str, why: str) -> None:
        runner = self.supervisor.runners.get(pg_id)
        if runner is not None and not runner.planned:  # an adopted engine it would not launch
            self._spawn(self.supervisor.stop(pg_id))
        if self.refused.get(pg_id) != why:  # said once per reason, not every apply
            self.refused[pg_id] = why
            self.on_failed(pg_id, why)

    def _start(self, d: DesiredPlacement, adopted: bool = False) -> None:
        if d.pg_id not in self._wanted:  # gone while its model was downloading
            return
        self.tasks[d.pg_id] = d.task
        self.generations[d.pg_id] = d.generation
        try:
            runtime.verify(d.release, d.release_signature, self.trusted)
            check_binary(d.release)
        except (TrustError, BinaryError) as exc:
            self._refuse(d.pg_id, f"refused to run: {exc}")
            return
        try:
            # An adopted engine runs the files its launch verified: no rehash at restart.
            if not adopted:
                self._verify_files(d)
        except ModelFileError as exc:
            self._refuse(d.pg_id, str(exc))
            return
        model_path = artifact_path(self.model_store, d.artifact_digest)
        adapter_paths = tuple(artifact_path(self.model_store, dg) for _, dg in _loaded(d))
        self.adapters[d.pg_id] = _loaded(d)

        if d.release.engine == "vllm":
            # engines/vllm.py plans it (Ray head + vLLM serve, Ray workers); install
            # refuses such groups, but one stored before it did still reaches here.
            self._refuse(d.pg_id, f"refused to run: {NOT_SUPERVISED}")
            return

        def make_plan(port: int) -> LaunchPlan:
            try:  # again at every (re)start: the binary or a file may change under it
                check_binary(d.release)
                self._verify_files(d)
            except (BinaryError, ModelFileError) as exc:
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
                proof=d.proof,
                adapters=adapter_paths,
            )
            if d.release.engine == "parallel-command":
                return plan_parallel_command(d.release, task, d.task, d.group, d.group_key or "")
            return plan_llamacpp(d.release, task, self.run_dir)

        self.services[d.pg_id] = d.service
        self.refused.pop(d.pg_id, None)
        fixed = d.port
        self.supervisor.ensure(
            EngineIdentity(
                d.pg_id,
                d.task,
                d.service,
                d.fingerprint(),
                d.release.id,
                d.engine_key if d.serves_api() else None,
            ),
            make_plan,
            (lambda: fixed) if fixed else (lambda: free_port(self.host, self.ports)),
        )


def _loaded(d: DesiredPlacement) -> tuple[tuple[str, str], ...]:
    """The adapters ``d``'s engine loads: none for a parallel command (its
    launcher has no way to), so its facts claim none and none is routed to it."""
    return () if d.release.engine == "parallel-command" else d.adapters
