"""A closed-loop load generator: N concurrent clients, each sending its next
request when the previous one ends, bounded in count and time.

It uses the gateway's own pooled HTTP/1.1 client (keep-alive, bodies read as
they arrive), so the generator costs little next to what it measures.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from letsinfer.gateway.engine_client import EngineClient, EngineError

# Less CPU than this in a cell is too few of /proc's 10 ms ticks to report
# (ten ticks: within about 10 %; a full run's cells use far more).
_MIN_CPU_S = 0.1


@dataclass
class CellResult:
    completed: int = 0
    errors: int = 0
    wall_s: float = 0.0
    latency_s: list[float] = field(default_factory=list)
    first_chunk_s: list[float] = field(default_factory=list)
    first_error: str = ""
    # The target server's own CPU time over the run, and the requests it got
    # in that time (warm-up included); 0 when the target's processes are not
    # this benchmark's.
    cpu_s: float = 0.0
    sent: int = 0

    @property
    def rps(self) -> float:
        return self.completed / self.wall_s if self.wall_s else 0.0

    def percentile(self, values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def p(self, q: float) -> float:
        return self.percentile(self.latency_s, q)

    def first_p(self, q: float) -> float:
        return self.percentile(self.first_chunk_s, q)

    def merged(self, other: CellResult) -> CellResult:
        """Two runs of one cell as one (an A/B pair measured twice)."""
        return CellResult(
            completed=self.completed + other.completed,
            errors=self.errors + other.errors,
            wall_s=self.wall_s + other.wall_s,
            latency_s=self.latency_s + other.latency_s,
            first_chunk_s=self.first_chunk_s + other.first_chunk_s,
            first_error=self.first_error or other.first_error,
            cpu_s=self.cpu_s + other.cpu_s,
            sent=self.sent + other.sent,
        )

    @property
    def cpu_per_request_s(self) -> float:
        """NaN when the run used too little CPU to measure (``_MIN_CPU_S``)."""
        return self.cpu_s / self.sent if self.sent and self.cpu_s >= _MIN_CPU_S else float("nan")


async def run_cell(
    base_url: str,
    path: str,
    body: bytes,
    *,
    authorization: str,
    stream: bool,
    concurrency: int,
    count: int,
    max_s: float,
    warmup: int = 0,
    client: EngineClient | None = None,
) -> CellResult:
    """``client``: kept connections to use and leave open (one of its own otherwise)."""
    own = client is None
    client = client or EngineClient(connect_timeout_s=10, read_timeout_s=60)
    result = CellResult()
    issued = 0
    deadline = 0.0

    async def one(record: bool) -> None:
        started = time.perf_counter()
        try:
            response = await client.post(base_url, path, body, authorization=authorization)
            first = await response.next_chunk()
            first_at = time.perf_counter()
            last = prev = first or b""
            while (chunk := await response.next_chunk()) is not None:
                prev, last = last, chunk
            ended = time.perf_counter()
            ok = response.status == 200 and (not stream or b"[DONE]" in prev + last)
            if not ok and not result.first_error:
                result.first_error = f"status {response.status}: {(prev + last)[-200:]!r}"
        except EngineError as exc:
            ok = False
            ended = first_at = time.perf_counter()
            if not result.first_error:
                result.first_error = str(exc)
        if not record:
            return
        if ok:
            result.completed += 1
            result.latency_s.append(ended - started)
            result.first_chunk_s.append(first_at - started)
        else:
            result.errors += 1

    async def worker() -> None:
        nonlocal issued
        while issued < count and time.perf_counter() < deadline:
            issued += 1
            await one(True)

    try:
        if warmup:  # open the connections and warm caches before measuring
            await asyncio.gather(*(one(False) for _ in range(warmup)))
        started = time.perf_counter()
        deadline = started + max_s
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - started
    finally:
        if own:
            await client.aclose()
    return result
