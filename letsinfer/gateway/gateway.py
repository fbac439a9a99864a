"""The gateway's parts, wired together once from its settings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from letsinfer.audit.denials import DenialLog
from letsinfer.config import ConfigError, GatewaySettings, TracingSettings
from letsinfer.gateway import external
from letsinfer.gateway.admission import Admission, AdmissionLimits
from letsinfer.gateway.availability import Availability
from letsinfer.gateway.cache import ResponseCache
from letsinfer.gateway.directory import Directory, Snapshot
from letsinfer.gateway.engine_client import EngineClient
from letsinfer.gateway.limits import WINDOW_S, KeyLimits, Limiter
from letsinfer.gateway.metrics import GatewayMetrics
from letsinfer.gateway.policy import RoutingPolicy
from letsinfer.gateway.routing import RoutingTable
from letsinfer.gateway.upstream import Upstream
from letsinfer.store.requests import KeyUsage
from letsinfer.usage.recorder import RequestLog

if TYPE_CHECKING:
    from letsinfer.gateway.tracing import Tracing

log = logging.getLogger("letsinfer.gateway")

RECOUNT_WARN_S = 5.0  # a request waiting this long for its key's counts is logged


@dataclass
class Gateway:
    directory: Directory
    routing: RoutingTable
    availability: Availability
    policy: RoutingPolicy
    admission: Admission
    metrics: GatewayMetrics
    upstream: Upstream
    max_body_bytes: int
    denials: DenialLog  # refused keys, counted (written by the node's background task)
    records: RequestLog | None = None  # per-request records (written in the background)
    tracing: Tracing | None = None  # OpenTelemetry, only when configured
    limiter: Limiter = field(default_factory=Limiter)  # keys with rate limits or a budget
    cache: ResponseCache = field(default_factory=lambda: ResponseCache(64 << 20))
    # Books the requests that ended in this turn of the loop now, not at its end
    # (set by letsinfer.gateway.serving): a recount must find them in the records.
    book_now: Callable[[], None] = lambda: None
    # The limits the limiter counts for each key, and those whose past requests
    # are still to be read from the request records.
    _counted: dict[str, KeyLimits] = field(default_factory=dict)
    _unread: dict[str, KeyLimits] = field(default_factory=dict)
    _members: dict[str, frozenset[str]] = field(default_factory=dict)  # a project's keys
    _reading: set[asyncio.Task[None]] = field(default_factory=set)
    # Keys whose counts are being read again: their requests wait for the read
    # (a spent budget must not look unspent while it runs).
    recounting: dict[str, asyncio.Event] = field(default_factory=dict)
    _next_ready: asyncio.Event | None = None  # set when the next read's keys are counted
    _slow: set[str] = field(default_factory=set)  # keys whose read was said to stall
    # External models (name: provider URL) whose provider [fetch] refused as
    # the main started: never published, so no request reaches that address
    # (set once, before serving; a model added again elsewhere is published).
    refused_providers: dict[str, str] = field(default_factory=dict)

    def budgets_spent(self) -> list[tuple[str, KeyLimits, float]]:
        """Keys that have spent their token budget: (name, limits, the
        period's start). For the webhook watch, never a request."""
        spent = []
        for name, limits in self._counted.items():
            start = self.limiter.exhausted(name, limits)
            if start is not None:
                spent.append((name, limits, start))
        return spent

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """A new view of keys and models (not per request): publish external
        models and canaries' splits; a key whose limits appeared, or now need
        counts not kept before (a budget period, a request rate), is counted
        afresh from the request records, in the background (:meth:`read_counts`)."""
        # A stopped cluster serves nothing: its external models neither.
        externals = {} if snapshot.system_stopped else snapshot.externals()
        for name, url in self.refused_providers.items():
            if name in externals and externals[name].url == url:
                del externals[name]
        external.sync(self.routing, externals)
        self.routing.set_canaries(snapshot.canaries())
        limited = {k.name: k.limits for k in snapshot.keys.values() if k.limits is not None}
        # A project's limits: one more scope, counted from its keys' records.
        for scope, (shared, members) in snapshot.projects.items():
            limited[scope] = shared
            self._members[scope] = members
        for gone in self._counted.keys() - limited.keys():
            del self._counted[gone]
            self._unread.pop(gone, None)  # (a read not begun yet would count it again)
            self.limiter.forget(gone)
        for name, limits in limited.items():
            before = self._counted.get(name)
            if before == limits:
                continue
            self._counted[name] = limits
            # A new number for what is counted already applies to the counts
            # as they are: no read, and no moment in which they are zero.
            if before is None or limits.counts_more_than(before) or name in self._unread:
                self._unread[name] = limits
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # not serving yet: the node calls read_counts() as it starts
            return
        self.read_counts()

    def read_counts(self) -> None:
        """Read the counts of the keys not read yet from the request records, in
        the background; their requests wait for it from now (:meth:`counted`),
        those of every other key are served meanwhile."""
        if not self._unread:
            return
        ready = self._next_ready
        if ready is None:  # (else a read not begun yet takes these keys too)
            ready = self._next_ready = asyncio.Event()
            task = asyncio.ensure_future(self.restore_usage())
            self._reading.add(task)
            task.add_done_callback(self._read_done)
        self.recounting.update(dict.fromkeys(self._unread, ready))

    async def restore_usage(self) -> None:
        """Rebuild the counts of the keys not read yet from the request records:
        their budget period's tokens and their last minute. With records off
        (``[requests] enabled = false``) the counts start from zero."""
        unread, self._unread = self._unread, {}
        ready, self._next_ready = self._next_ready or asyncio.Event(), None
        try:
            if not unread:
                return
            if self.records is None:
                log.warning(
                    "request records are off: rate limits and budgets of %s count from now "
                    "(and from zero again after a restart)",
                    ", ".join(sorted(unread)),
                )
                return
            now = self.limiter.clock()
            starts = {n: self.limiter.period_start(limits, now) for n, limits in unread.items()}
            # From here on in memory; before it, in the records read now (all in
            # this one step of the loop: nothing ends between them).
            self.book_now()
            generations = {n: self.limiter.recount(n, limits) for n, limits in unread.items()}
            try:
                usage = self._project_usage(
                    starts, await self.records.usage_of(self._with_members(starts), now - WINDOW_S)
                )
            except Exception as exc:  # a broken records file: count from now, say so
                log.error("cannot read the request records to rebuild rate limits: %s", exc)
                usage = {}
            for name, (spent, recent) in usage.items():
                limits = self._counted.get(name) if name in generations else None
                if limits is not None:
                    self.limiter.restore(
                        name, limits, spent, recent, generations[name], starts[name]
                    )
        finally:  # (after the counts are restored: its waiters see them)
            for name in [n for n, r in self.recounting.items() if r is ready]:
                del self.recounting[name]
                self._slow.discard(name)
            ready.set()

    def _with_members(self, starts: dict[str, float | None]) -> dict[str, float | None]:
        """The keys whose records to read: those asked, and each project
        scope's keys, in one read (with the project's period start; a key
        with a budget of its own keeps its own, and the project's spent is
        then read over that period)."""
        out = dict(starts)
        for scope, start in starts.items():
            for key in self._members.get(scope, ()):
                out.setdefault(key, start)
        return out

    def _project_usage(
        self, starts: dict[str, float | None], usage: dict[str, KeyUsage]
    ) -> dict[str, KeyUsage]:
        """``usage`` with each project scope among ``starts``: the sum of its keys'."""
        out = dict(usage)
        for scope in starts:
            if scope not in self._members:
                continue
            spent, recent = 0, []
            for key in self._members[scope]:
                had, seen = usage.get(key, (0, []))
                spent += had
                recent.extend(seen)
            out[scope] = (spent, sorted(recent))
        return out

    def _read_done(self, task: asyncio.Task[None]) -> None:
        self._reading.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # (its keys were let go meanwhile: they count from what memory holds)
            log.error("reading the request records to rebuild rate limits failed", exc_info=exc)

    def limits_of(self, key: str) -> KeyLimits | None:
        """A key's limits as they are now (a request may have read its key before a change)."""
        return self._counted.get(key)

    async def counted(self, key: str) -> None:
        """Wait until no read of ``key``'s counts is under way, however long it
        takes: while one runs, memory holds none of what it reads
        (:meth:`Limiter.recount`), so a request let through would go on zero.
        A failed read ends the wait (counting from now); one that takes
        longer than ``RECOUNT_WARN_S`` is logged, once."""
        try:
            async with asyncio.timeout(RECOUNT_WARN_S):
                await self._read_of(key)
        except TimeoutError:
            if key not in self._slow:
                self._slow.add(key)
                log.warning("key %s: its counts are still being read; its requests wait", key)
            await self._read_of(key)

    async def _read_of(self, key: str) -> None:
        while (ready := self.recounting.get(key)) is not None:
            await ready.wait()  # (a later change may have begun another read)

    @classmethod
    def build(
        cls,
        directory: Directory,
        routing: RoutingTable,
        settings: GatewaySettings | None = None,
        denials: DenialLog | None = None,
        records: RequestLog | None = None,
        tracing: TracingSettings | None = None,
    ) -> Gateway:
        s = settings or GatewaySettings()
        policy = RoutingPolicy(
            affinity_prefix_chars=s.affinity_prefix_chars,
            affinity_min_chars=s.affinity_min_chars,
            load_bound=s.affinity_load_bound,
            fact_max_age_s=s.fact_max_age_s,
        )
        availability = Availability(directory, routing)
        admission = Admission(
            routing,
            policy,
            AdmissionLimits(s.queue_max_waiting, s.queue_max_wait_s),
            availability.refusal,
        )
        metrics = GatewayMetrics(routing, admission)
        client = EngineClient(s.upstream_connect_timeout_s, s.upstream_timeout_s)
        traces = None
        upstream = Upstream(client, admission, metrics)
        cache = ResponseCache(s.cache_max_bytes)
        if tracing is not None and tracing.otlp_endpoint is not None:
            try:  # only now: a gateway without tracing never loads OpenTelemetry's SDK
                from letsinfer.gateway.tracing import TracedUpstream, Tracing
            except ImportError as exc:
                raise ConfigError(
                    f"tracing.otlp_endpoint is set, but OpenTelemetry is not installed ({exc}); "
                    "install it with: pip install 'letsinfer[tracing]'"
                ) from exc
            traces = Tracing(tracing)
            upstream = TracedUpstream(client, admission, metrics, tracing=traces)
        upstream.max_answer_bytes = s.max_answer_bytes
        gateway = cls(
            directory=directory,
            routing=routing,
            availability=availability,
            policy=policy,
            admission=admission,
            metrics=metrics,
            upstream=upstream,
            max_body_bytes=s.max_body_bytes,
            denials=denials or DenialLog(directory.store),
            records=records,
            tracing=traces,
            cache=cache,
        )
        directory.subscribe(gateway.on_snapshot)
        return gateway

    async def aclose(self) -> None:
        for task in list(self._reading):
            task.cancel()
        await self.upstream.aclose()
        if self.tracing is not None:
            await self.tracing.shutdown()
