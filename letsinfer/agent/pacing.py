"""How long an agent waits before its next report to the main.

- Answered: the heartbeat interval.
- 503 with ``Retry-After`` (the main is shedding load, see
  letsinfer/authority/overload.py): that long, times 1 to 1.5, so nodes told
  together come back spread out.
- No answer (a timeout, a refused or broken connection): exponential from the
  interval, each wait drawn between the interval and the bound (jitter), the
  bound at most ``max_backoff_s`` (three intervals by default: the main judges
  a node stale after a few silent intervals, and it must not be the node's own
  backoff that makes it so once the main is back).
- Refused (403, 422): twenty intervals (the main audits every refusal).

A main that is down or struggling thus sees fewer, spread reports, never a
synchronised stampede of retries.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import httpx

BUSY_JITTER = 0.5  # a busy answer's wait: Retry-After times 1 to 1 + this
REFUSED_INTERVALS = 20


def keepalive_s(interval_s: float) -> float:
    """How long an agent keeps its idle connection to the main: past the
    longest wait between two reports it expects to make (a busy answer's
    Retry-After of two intervals, spread), and below the main's own idle
    timeout (letsinfer.connections.control_limits), so the agent closes first."""
    return 3 * interval_s + 2


@dataclass
class ReportPacing:
    interval_s: float
    max_backoff_s: float | None = None  # default: three intervals
    rng: Callable[[], float] = random.random
    failures: int = 0  # reports in a row that got no answer

    def answered(self) -> float:
        self.failures = 0
        return self.interval_s

    def busy(self, retry_after_s: float | None) -> float:
        """The main answered 503: wait as long as it asked, spread."""
        self.failures = 0
        base = max(retry_after_s or self.interval_s, self.interval_s)
        return base * (1.0 + BUSY_JITTER * self.rng())

    def failed(self) -> float:
        """No answer at all: back off, spread."""
        self.failures += 1
        cap = self.max_backoff_s or 3 * self.interval_s
        bound = min(cap, self.interval_s * 2.0 ** min(self.failures, 16))
        return self.interval_s + (bound - self.interval_s) * self.rng()

    def refused(self) -> float:
        self.failures = 0
        return self.interval_s * REFUSED_INTERVALS


def retry_after(resp: httpx.Response) -> float | None:
    """A response's ``Retry-After`` in seconds (the delta form only), or None."""
    value = resp.headers.get("retry-after")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    if seconds is None or not 0 <= seconds <= 3600:
        return None
    return seconds
