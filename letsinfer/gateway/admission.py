"""Admission: per-key concurrency, then a free slot on a replica, or a fair wait.

A request first counts against its API key's concurrency limit (over it:
429 at once). It then takes a slot on a replica chosen by the policy; the
slot is the replica's ``in_flight`` count, taken and given back only here,
so an engine never gets more requests than its capacity. When every usable
replica of the model is full, the request waits in one shared, bounded
queue. As slots free, waiters are served by their key's priority band first
(interactive, then standard, then batch: a lower band gets a slot when no
waiter of a higher one can use it) and, within a band, round-robin across
API keys: one key cannot take a band by opening many connections, and a busy
key cannot starve the others. Bands age so that every band moves: once
``band_aging`` slots in a row went to higher bands while a lower band had
waiters, the next slot is that band's, so steady interactive load slows batch
keys down but never stops them. Past the queue bound or the wait limit the
answer is 429 with Retry-After (a full queue makes room for a request that
outranks its newest waiter: a higher band, or a key with fewer waiting);
when the model has no usable replica at all, 503.

A request for a LoRA adapter waits in its base model's queue, for a replica
that has loaded the adapter.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from letsinfer.gateway import policy
from letsinfer.gateway.errors import GatewayError, adapter_not_loaded, no_replica
from letsinfer.gateway.routing import Replica, RoutingTable


@dataclass(frozen=True)
class AdmissionLimits:
    max_waiting: int = 1024  # requests waiting across all models and keys
    max_wait_s: float = 30.0
    # Slots in a row higher bands may take while a lower band waits; the next
    # one that band can use is its own.
    band_aging: int = 8


class Loader(Protocol):
    """What admission asks of the capacity controller (letsinfer.capacity)."""

    def admit_load(self, service: str) -> bool: ...
    def loading(self, service: str) -> bool: ...


BANDS = 3  # 0 interactive, 1 standard, 2 batch
STANDARD = 1
_PRIORITY = tuple(range(BANDS))


class _Waiter:
    __slots__ = (
        "adapter",
        "band",
        "exclude",
        "future",
        "key",
        "prefix_hash",
        "service",
        "since",
        "timer",
    )

    def __init__(
        self,
        service: str,
        key: str,
        prefix_hash: int | None,
        exclude: frozenset[str],
        future: asyncio.Future[Replica],
        band: int,
        adapter: str | None,
    ) -> None:
        self.service = service
        self.key = key
        self.prefix_hash = prefix_hash
        self.exclude = exclude
        self.future = future
        self.band = band
        self.adapter = adapter
        self.since = future.get_loop().time()
        self.timer: asyncio.TimerHandle | None = None


class _Waiters(collections.deque[_Waiter]):
    """One key's waiters in a band, first come first served; ``mixed`` once
    they differ in what they can use (an adapter, a group they exclude), so
    that a slot the first cannot use may go to one behind it."""

    mixed = False


_Band = dict[str, _Waiters]  # key -> its waiters; the dict's order is the rotation


def concurrency_exceeded(key: str, limit: int) -> GatewayError:
    return GatewayError(
        429,
        f"API key '{key}' already has {limit} request(s) in progress, its concurrency "
        "limit; retry when one finishes.",
        type_="rate_limit_exceeded",
        code="concurrency_limit_exceeded",
        headers={"retry-after": "1"},
    )


def queue_full(service: str, retry_after: int) -> GatewayError:
    return GatewayError(
        429,
        f"Model '{service}' is at capacity and its wait queue is full; retry later.",
        type_="rate_limit_exceeded",
        code="queue_full",
        headers={"retry-after": str(retry_after)},
    )


def queue_timeout(service: str, waited_s: float, retry_after: int) -> GatewayError:
    return GatewayError(
        429,
        f"Model '{service}' stayed at capacity for {waited_s:g}s while this request "
        "waited; retry later.",
        type_="rate_limit_exceeded",
        code="queue_timeout",
        headers={"retry-after": str(retry_after)},
    )


class Admission:
    def __init__(
        self,
        routing: RoutingTable,
        routing_policy: policy.RoutingPolicy,
        limits: AdmissionLimits,
        unavailable: Callable[[str, str], GatewayError] | None = None,
    ) -> None:
        self.routing = routing
        # (model, failures so far) -> the error when no replica is usable
        self.unavailable = unavailable or (
            lambda service, failures: no_replica(service, failures or routing.explain(service))
        )
        self.policy = routing_policy
        self.limits = limits
        self.retry_after = max(1, math.ceil(min(limits.max_wait_s, 5.0)))
        # Per model, one rotation of keys per band (highest first); a model is
        # here only while something waits for it.
        self._queues: dict[str, list[_Band]] = {}
        # Per model (while something waits), per band: the slots that went to
        # higher bands in a row while this band had waiters (its age).
        self._passed: dict[str, list[int]] = {}
        # Per model, how many wait: the metrics scrape reads it from the
        # control thread, which must not walk the queues while this loop
        # changes them (a dict iterated as it changes size raises).
        self._depth: dict[str, int] = {}
        self._per_key: dict[str, int] = {}
        # Loads models on demand (letsinfer.capacity): a request that finds no
        # usable replica waits for a load instead of a 503, when it says so.
        self.loader: Loader | None = None
        routing.subscribe(self._on_routing_change)

    # -- per-key concurrency ----------------------------------------------------
    def enter_key(self, key: str, limit: int | None) -> None:
        """Count a request against its key, or refuse it (429) over the limit."""
        current = self._per_key.get(key, 0)
        if limit is not None and current >= limit:
            raise concurrency_exceeded(key, limit)
        self._per_key[key] = current + 1

    def leave_key(self, key: str) -> None:
        left = self._per_key[key] - 1
        if left:
            self._per_key[key] = left
        else:
            del self._per_key[key]

    def key_in_flight(self, key: str) -> int:
        return self._per_key.get(key, 0)

    # -- replica slots ----------------------------------------------------------
    def _replicas(
        self, service: str, adapter: str | None, split: bool = False
    ) -> tuple[Replica, ...]:
        """``split``: one side of a canary's split (letsinfer.gateway.routing)."""
        replicas = self.routing.routed(service) if split else self.routing.replicas(service)
        if adapter is not None:  # only the groups whose engine loaded it
            replicas = tuple(r for r in replicas if adapter in r.adapters)
        return replicas

    def _choose(
        self,
        service: str,
        prefix_hash: int | None,
        exclude: frozenset[str],
        adapter: str | None = None,
    ) -> Replica | None:
        """The replica the policy would give a slot on now (None: none free)."""
        return policy.choose(
            # A request that excludes groups (a retry, a pinned eval) is past
            # a canary's split: any other group may take it.
            self._replicas(service, adapter, not exclude),
            self.routing.clock(),
            self.policy,
            prefix_hash,
            exclude,
        )

    def _pick(
        self,
        service: str,
        prefix_hash: int | None,
        exclude: frozenset[str],
        adapter: str | None = None,
    ) -> Replica | None:
        replica = self._choose(service, prefix_hash, exclude, adapter)
        if replica is not None:
            replica.in_flight += 1
            replica.taken += 1
        return replica

    def take_now(
        self,
        service: str,
        prefix_hash: int | None = None,
        exclude: frozenset[str] = frozenset(),
        adapter: str | None = None,
    ) -> Replica | None:
        """A free slot now, as :meth:`acquire` gives one; None when none is free
        or requests wait for the model already (they go first). Never waits."""
        if service in self._queues:
            return None
        return self._pick(service, prefix_hash, exclude, adapter)

    def _any_usable(self, service: str, exclude: frozenset[str], adapter: str | None) -> bool:
        now = self.routing.clock()
        return any(
            r.pg_id not in exclude and policy.usable(r, now, self.policy)
            for r in self._replicas(service, adapter)
        )

    async def acquire(
        self,
        service: str,
        key: str,
        prefix_hash: int | None = None,
        exclude: frozenset[str] = frozenset(),
        failures: str = "",
        band: int = STANDARD,
        adapter: str | None = None,
    ) -> Replica:
        """A slot on a replica of ``service`` (one that loaded ``adapter``, when
        given); give it back with :meth:`release`. ``band``: the key's priority
        band (0 highest) when it has to wait.

        Raises 503 when no usable replica exists, 429 when the queue is full or
        the wait limit passes. Cancelling the caller (the client went away)
        leaves the queue clean."""
        replica = self.take_now(service, prefix_hash, exclude, adapter)
        if replica is not None:
            return replica
        if not self._any_usable(service, exclude, adapter):
            if adapter is not None and self._any_usable(service, exclude, None):
                raise adapter_not_loaded(adapter, service)
            # A model loaded on demand: the request waits for its load.
            if self.loader is None or not self.loader.admit_load(service):
                raise self.unavailable(service, failures)
        if self.depth() >= self.limits.max_waiting and not self._make_room(band, key):
            raise queue_full(service, self.retry_after)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(service, key, prefix_hash, exclude, loop.create_future(), band, adapter)
        bands = self._queues.get(service)
        if bands is None:
            bands = self._queues[service] = [{} for _ in range(BANDS)]
            self._passed[service] = [0] * BANDS
        waiters = bands[band].get(key)
        if waiters is None:
            waiters = bands[band][key] = _Waiters()
        elif not waiters.mixed:
            first = waiters[0]
            waiters.mixed = first.adapter != adapter or first.exclude != exclude
        waiters.append(waiter)
        self._depth[service] = self._depth.get(service, 0) + 1
        waiter.timer = loop.call_later(self.limits.max_wait_s, self._expire, waiter)
        # A slot the waiters ahead cannot use (another adapter, a group they
        # excluded) is this one's now, not after the next release. (One
        # check when all are full, the usual case here.)
        if self._choose(service, prefix_hash, exclude, adapter) is not None:
            self._serve(service)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._remove(waiter)
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result())  # a slot arrived as we left
            raise
        finally:
            waiter.timer.cancel()

    def release(self, replica: Replica) -> None:
        """Give a slot back and hand it to the next fair waiter, if any."""
        replica.in_flight -= 1
        if replica.service in self._queues:
            self._serve(replica.service)

    # -- the queue ---------------------------------------------------------------
    def _serve(self, service: str) -> None:
        """Hand free slots to waiters: the highest band first, and within a band
        one key at a time in rotation. A lower band gets the slots no waiter of
        a higher band can use (another adapter, an excluded group), and the
        next one once it has been passed over ``band_aging`` times in a row."""
        bands = self._queues.get(service)
        if bands is None:
            return
        passed = self._passed[service]
        aging = self.limits.band_aging
        blocked = 0  # bands (bits) no free slot serves: slots are only taken here
        while True:
            order = _PRIORITY
            if max(passed) >= aging:  # (rare: most slots go to waiters of one band)
                for band in range(1, BANDS):
                    if passed[band] >= aging and bands[band] and not blocked >> band & 1:
                        order = (band, *_PRIORITY)  # its turn, then the usual order
                        break
            served = -1
            for band in order:
                if blocked >> band & 1 or not bands[band]:
                    continue
                if self._turn(service, bands[band]):
                    served = band
                    break
                blocked |= 1 << band
            if served < 0:
                break
            passed[served] = 0
            for lower in range(served + 1, BANDS):
                passed[lower] = passed[lower] + 1 if bands[lower] else 0
        if not any(bands):
            self._drop(service)

    def _turn(self, service: str, keys: _Band) -> bool:
        """A free slot to the next key in this band's rotation that one serves
        (the key goes to the back); False when none serves any of them."""
        for key in list(keys):
            waiters = keys[key]
            # A waiter whose client left (its task cancelled, not yet run to
            # take it out) gets no slot: nothing would give it back.
            while waiters and waiters[0].future.done():
                waiters.popleft()
                self._depth[service] -= 1
            if not waiters:
                del keys[key]
                continue
            taken = self._take_for(service, waiters)
            if taken is None:
                continue
            waiter, replica = taken
            self._depth[service] -= 1
            del keys[key]
            if waiters:
                keys[key] = waiters
            waiter.future.set_result(replica)
            return True
        return False

    def _drop(self, service: str) -> None:
        """Nothing waits for the model any more."""
        del self._queues[service]
        del self._depth[service]
        del self._passed[service]

    def _take_for(self, service: str, waiters: _Waiters) -> tuple[_Waiter, Replica] | None:
        """The key's first waiter that a free slot can serve, taken out of its
        queue, with the slot; None when no slot is free for any of them."""
        tried: set[tuple[str | None, frozenset[str]]] = set()  # kinds no slot is free for
        for waiter in waiters:
            kind = (waiter.adapter, waiter.exclude)
            if kind in tried or waiter.future.done():
                continue
            replica = self._pick(service, waiter.prefix_hash, waiter.exclude, waiter.adapter)
            if replica is not None:
                waiters.remove(waiter)  # (the first, unless they are mixed)
                return waiter, replica
            if not waiters.mixed:  # all of one kind: none behind it can use a slot either
                return None
            tried.add(kind)
        return None

    def _make_room(self, band: int, key: str) -> bool:
        """The queue is full: the newest waiter a request of ``key`` in ``band``
        outranks gives up its place (429 ``queue_full``, or its fallback), so
        that neither a lower band nor another key of the same band can lock it
        out by filling the queue. It outranks the waiters of lower bands and,
        in its own band, those of a key with at least two more waiting than
        it has (less would only trade places). False: it outranks none."""
        for lower in range(BANDS - 1, band - 1, -1):
            counts: dict[str, int] = {}
            for bands in self._queues.values():
                for k, waiters in bands[lower].items():
                    counts[k] = counts.get(k, 0) + len(waiters)
            if not counts:
                continue
            most = max(counts, key=counts.__getitem__)
            if lower == band and counts[most] < counts.get(key, 0) + 2:
                return False
            newest = max(
                (
                    bands[lower][most][-1]
                    for bands in self._queues.values()
                    if bands[lower].get(most)
                ),
                key=lambda w: w.since,
            )
            self._remove(newest)
            if not newest.future.done():
                newest.future.set_exception(queue_full(newest.service, self.retry_after))
            return True
        return False

    def _remove(self, waiter: _Waiter) -> None:
        bands = self._queues.get(waiter.service)
        if bands is None:
            return
        keys = bands[waiter.band]
        waiters = keys.get(waiter.key)
        if waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        self._depth[waiter.service] -= 1
        if not waiters:
            del keys[waiter.key]
        if not any(bands):
            self._drop(waiter.service)

    def _expire(self, waiter: _Waiter) -> None:
        if waiter.future.done():
            return
        self._remove(waiter)
        waiter.future.set_exception(
            queue_timeout(waiter.service, self.limits.max_wait_s, self.retry_after)
        )

    def refuse_waiters(self, service: str, error: GatewayError) -> None:
        """Every request waiting for ``service`` gets ``error`` (a load that
        could not be made, or failed)."""
        for keys in list(self._queues.get(service, ())):
            for waiters in list(keys.values()):
                for waiter in list(waiters):
                    self._remove(waiter)
                    if not waiter.future.done():
                        waiter.future.set_exception(error)

    def _on_routing_change(self, service: str) -> None:
        if service not in self._queues:
            return
        self._serve(service)  # a new or resumed replica brings free slots
        if self.loader is not None and self.loader.loading(service):
            return  # a load is under way: its waiters wait for it
        for keys in list(self._queues.get(service, ())):
            for waiters in list(keys.values()):
                for waiter in list(waiters):
                    if not self._any_usable(service, waiter.exclude, waiter.adapter):
                        self._remove(waiter)
                        if not waiter.future.done():  # (its client may have left this turn)
                            waiter.future.set_exception(self.unavailable(service, ""))

    def depth(self, service: str | None = None) -> int:
        """How many wait (for ``service``); safe to call from another thread
        (one lookup, or a sum over a few models' counts with no Python code
        between items)."""
        if service is None:
            return sum(self._depth.values())
        return self._depth.get(service, 0)
