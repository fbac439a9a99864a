"""Bounded denial records: refusals aggregated per source, action and reason.

Every refusal of a request without valid credentials (no or a bad client
certificate, a bad API key, a CLI scope denial, a pin mismatch, a refused
admin-socket caller, refused facts) goes through here, never straight to the
audit chain. In a serving process :class:`DenialLog` counts them in memory
(no database write on the request path) and a background task writes them:
the first refusal of a kind at once (within a tick), later ones as one
record per interval with their count (the store's open windows, see
letsinfer.store.audit). A flood of any size adds a bounded number of records.
A short-lived process (the CLI) writes through the same windows with
:func:`record_denial`, so a loop of denied commands aggregates too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from letsinfer.store import Denial

log = logging.getLogger("letsinfer.audit")

# Distinct (source, action, reason) kept between writes; beyond this, new
# sources are counted together, so spoofed sources cannot grow memory or rows.
MAX_KINDS = 512
# The most characters of a reason kept (a reason longer than this is a bug:
# one that carries a sender's text).
MAX_REASON = 300
OTHER_SOURCES = "(other sources)"
# How long the writer waits for more before it writes a new kind of refusal.
_GATHER_S = 0.2


class DenialStore(Protocol):
    def record_denials(self, denials: list[Denial], now: float, interval_s: float) -> None: ...
    def close_denial_windows(self, now: float, interval_s: float) -> int: ...


class DenialLog:
    """Counts refusals in memory; :meth:`run` (or :meth:`flush`) writes them."""

    def __init__(
        self,
        store: DenialStore,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.clock = clock
        self._pending: Counter[tuple[str, str, str]] = Counter()
        # Kinds seen this interval: a new one is written at once, and there are
        # at most MAX_KINDS of them (more sources are counted together).
        self._kinds: set[tuple[str, str, str]] = set()
        self._kinds_since = clock()
        self._lock = threading.Lock()  # refusals also come from worker threads
        self._new = threading.Event()

    def note(self, source: str, action: str, reason: str) -> None:
        """One refusal. Cheap: a counter in memory. ``reason`` is the kind of
        refusal, never a sender's free text; cut to MAX_REASON all the same."""
        key = (source, action, reason[:MAX_REASON])
        with self._lock:
            if key not in self._kinds:
                if len(self._kinds) >= MAX_KINDS:
                    key = (OTHER_SOURCES, action, reason)
                self._kinds.add(key)
                self._new.set()
            self._pending[key] += 1

    def tls_refusals(self, plane: str) -> Callable[[str, str], None]:
        """``on_refused`` for a mutual-TLS plane's handshakes."""
        return lambda address, reason: self.note(f"tls:{address}", f"{plane}:handshake", reason)

    def flush(self) -> None:
        """Write what was counted, and the counts of windows that ended."""
        now = self.clock()
        with self._lock:
            pending, self._pending = self._pending, Counter()
            self._new.clear()
            if now - self._kinds_since >= self.interval_s:
                self._kinds = set(pending)
                self._kinds_since = now
        batch = [Denial(s, a, r, n) for (s, a, r), n in pending.items()]
        try:
            self.store.record_denials(batch, now, self.interval_s)
        except Exception as exc:  # the store is down: keep them for the next round
            with self._lock:
                self._pending.update(pending)
            log.error("cannot write refusals to the audit chain: %s", exc)

    async def run(self, tick_s: float = 2.0) -> None:
        """Write a new kind of refusal at once (a fraction of a second to gather
        its company), counts and ended windows every ``tick_s``. Writes once
        more when cancelled."""
        last = time.monotonic()
        try:
            while True:
                await asyncio.sleep(_GATHER_S)
                if self._new.is_set() or time.monotonic() - last >= tick_s:
                    last = time.monotonic()
                    self.flush()
        finally:
            with contextlib.suppress(Exception):
                self.flush()


def record_denial(
    store: DenialStore, source: str, action: str, reason: str, interval_s: float
) -> None:
    """One refusal in a short-lived process (the CLI): aggregated in the
    store's open windows like everyone else's. Never fails the caller."""
    try:
        store.record_denials([Denial(source, action, reason)], time.time(), interval_s)
    except Exception as exc:
        log.warning("could not audit a refusal: %s", exc)
