"""The proxies' own cost counted in instructions, not timed: figures that hold
on a shared or noisy machine, where requests per second and CPU time swing
with whatever else runs (see docs/benchmarks.md).

    ./dev bench --instructions
    python -m benchmarks.instructions [--before DIR] [--requests N] [--json F]

The zero-delay mock (every token at once) and the load generator run as they
are; each proxy (nginx, the Python floor, letsinfer as a main runs it with
items 1-5 of issue 16 configured, and ``before``, another checkout's gateway)
runs under valgrind's callgrind, its instrumentation off until it serves. For
each cell (plain and streamed, 1 and 50 clients) its counters are zeroed after
a warm-up, N requests are sent, and the counters read: the instructions every
thread of the process executed, per request.

Only user space is counted: the kernel's work in a proxy's system calls (its
reads and writes on the sockets, most of nginx's cost) is not. So
letsinfer/nginx here is far above the CPU-time ratio of the zero-delay run;
what this run is for is comparing Python with Python (letsinfer against the
floor, and against ``before`` for a change), where the same runtime's calls
cancel out, to about 1 % at one client.

Under callgrind a proxy runs tens of times slower, so with 50 clients it
finds more requests waiting at each turn of its loop than it would natively:
the 50-client cells count the cost of a request in a busy proxy, for every
row alike. Work a proxy does on a timer (letsinfer's facts, nginx's none) is
measured while idle, before the cells, and taken out in proportion to each
cell's duration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path

from benchmarks import baselines
from benchmarks.gateway import (
    PATH,
    ZERO,
    Target,
    _body,
    as_a_main,
    install_uvloop,
    start_floor,
    start_gateway,
    start_mock,
)
from benchmarks.load import CellResult, run_cell
from letsinfer.gateway.engine_client import EngineClient

CELLS = ((False, 1), (False, 50), (True, 1), (True, 50))  # (stream, clients)
IDLE_S = 5.0
WARMUP = 100
START_TIMEOUT_S = 300.0  # Python's imports under valgrind (instrumentation off)


def callgrind(work: Path, name: str) -> tuple[str, ...]:
    return (
        "valgrind",
        "-q",
        "--tool=callgrind",
        "--instr-atstart=no",  # near native speed until `callgrind_control -i on`
        "--dump-instr=no",
        f"--callgrind-out-file={work}/{name}.%p.callgrind",
    )


@dataclass
class Counts:
    instructions: int
    wall_s: float


class Counter:
    """callgrind's counters of one running process, read between requests."""

    def __init__(self, pid: int, work: Path, name: str) -> None:
        self.pid = pid
        self.files = f"{name}.{pid}.callgrind"
        self.work = work
        self.dumps = 0
        self.started = 0.0

    def _control(self, *args: str) -> None:
        # (callgrind_control exits 0 whatever happens: its "OK." says it was done)
        done = subprocess.run(
            ["callgrind_control", *args, str(self.pid)], capture_output=True, text=True, timeout=60
        )
        if "OK." not in done.stdout:
            raise RuntimeError(f"callgrind_control {' '.join(args)}: {done.stdout}{done.stderr}")

    def instrument(self) -> None:
        self._control("-i", "on")

    def zero(self) -> None:
        self._control("-z")
        self.started = time.perf_counter()

    def read(self) -> Counts:
        """What ran since ``zero``: counters dumped to a new file and parsed."""
        self._control("-d")
        wall = time.perf_counter() - self.started
        self.dumps += 1
        path = self.work / f"{self.files}.{self.dumps}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            counts = _totals(path)
            if counts is not None:
                return Counts(counts["Ir"], wall)
            time.sleep(0.1)
        raise RuntimeError(f"callgrind wrote no totals to {path}")


def _totals(path: Path) -> dict[str, int] | None:
    """A callgrind dump's event totals by name; None until it is whole."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    events: list[str] = []
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:") and events:
            return dict(zip(events, map(int, line.split()[1:]), strict=False))
    return None


@dataclass
class Row:
    instructions: float  # per request, what the timers ran meanwhile taken out
    requests: int
    errors: int


def measure(target: Target, counter: Counter, requests: int, idle: Counts) -> dict[str, Row]:
    rows = {}
    for stream, clients in CELLS:
        cell = f"{'stream' if stream else 'plain'} c={clients}"

        async def warm_then_count(stream: bool = stream, clients: int = clients) -> CellResult:
            """The warm-up's connections kept for the count: none is opened in it."""
            client = EngineClient(connect_timeout_s=10, read_timeout_s=600)

            def send(count: int) -> Coroutine[None, None, CellResult]:
                return run_cell(
                    target.url,
                    PATH,
                    _body(stream),
                    authorization=target.authorization,
                    stream=stream,
                    concurrency=clients,
                    count=count,
                    max_s=3600,
                    client=client,
                )

            try:
                await send(max(min(WARMUP, requests), clients))
                counter.zero()  # (blocking the loop: nothing of the client's is in flight)
                return await send(requests)
            finally:
                await client.aclose()

        result = asyncio.run(warm_then_count())
        counts = counter.read()
        done, errors = result.completed, result.errors
        on_timers = idle.instructions * counts.wall_s / idle.wall_s
        rows[cell] = Row((counts.instructions - on_timers) / max(done, 1), done, errors)
        print(
            f"  {target.name:<10} {cell:<12} {rows[cell].instructions / 1000:>8.1f}k instructions"
            f" a request ({done} requests, {errors} errors)",
            flush=True,
        )
    return rows


def start(
    name: str, work: Path, upstream_port: int, stack: contextlib.ExitStack, before: Path | None
) -> Target:
    wrap = callgrind(work, name)
    upstream = f"http://127.0.0.1:{upstream_port}"
    if name == "nginx":
        server = baselines.nginx(upstream_port, work, wrap, START_TIMEOUT_S)
        stack.callback(server.stop)
        return Target(name, server.url, server=server)
    if name == "floor":
        server = start_floor(work, upstream, wrap, START_TIMEOUT_S)
        stack.callback(server.stop)
        return Target(name, server.url, server=server)
    tree = before.resolve() if name == "before" and before else None
    flags = as_a_main(work, name)
    return start_gateway(
        name, work, upstream, stack, *flags, tree=tree, wrap=wrap, start_timeout=START_TIMEOUT_S
    )


def report(results: dict[str, dict[str, Row]]) -> dict[str, dict[str, float]]:
    ratios: dict[str, dict[str, float]] = {}
    print(f"\n{'cell':<12} {'target':<10} {'instructions':>12}")
    for stream, clients in CELLS:
        cell = f"{'stream' if stream else 'plain'} c={clients}"
        for name, rows in results.items():
            row = rows[cell]
            print(f"{cell:<12} {name:<10} {row.instructions:>12,.0f}")
        ours = results.get("letsinfer", {}).get(cell)
        lines = []
        for base in ("nginx", "floor", "before"):
            theirs = results.get(base, {}).get(cell)
            if ours and theirs and theirs.instructions > 0:
                ratio = ours.instructions / theirs.instructions
                ratios.setdefault(cell, {})[f"letsinfer/{base}"] = ratio
                lines.append(f"letsinfer/{base} {ratio:.3f}x")
        if lines:
            print("  " + ";  ".join(lines))
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per cell (default 2000)")
    parser.add_argument("--before", type=Path, help="another letsinfer checkout, measured too")
    parser.add_argument(
        "--targets",
        default="nginx,floor,letsinfer",
        help="comma-separated, of nginx, floor, letsinfer (default: all three)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep callgrind's dumps in this folder, for callgrind_annotate "
        "(per target: the idle count, then one per cell)",
    )
    args = parser.parse_args(argv)
    names = [n for n in args.targets.split(",") if n] + (["before"] if args.before else [])
    if unknown := set(names) - {"nginx", "floor", "letsinfer", "before"}:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    # Every Python row with one hash seed: str and bytes hashes, and so the
    # probing of each dict and set, alike from run to run and row to row.
    os.environ["PYTHONHASHSEED"] = "0"
    install_uvloop()

    print(f"proxy instructions (callgrind): {args.requests} requests a cell, zero-delay mock")
    results: dict[str, dict[str, Row]] = {}
    idle_rates: dict[str, float] = {}
    skipped: dict[str, str] = {}
    with (
        tempfile.TemporaryDirectory(prefix="letsinfer-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work = Path(tmp)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            work = args.keep
        mock = start_mock(work, ZERO)
        stack.callback(mock.stop)
        for name in names:
            with contextlib.ExitStack() as own:  # one proxy under valgrind at a time
                try:
                    target = start(name, work, mock.port, own, args.before)
                except (RuntimeError, OSError, baselines.Unavailable) as exc:
                    print(f"\n!!! {name} SKIPPED: {exc}\n", flush=True)
                    skipped[name] = str(exc)
                    continue
                assert target.server is not None and target.server.proc is not None
                counter = Counter(target.server.proc.pid, work, name)
                counter.instrument()
                counter.zero()
                time.sleep(IDLE_S)
                idle = counter.read()
                idle_rates[name] = idle.instructions / idle.wall_s
                results[name] = measure(target, counter, args.requests, idle)
    ratios = report(results)
    if args.json:
        payload = {
            "requests_per_cell": args.requests,
            "skipped": skipped,
            "idle_instructions_per_s": idle_rates,
            "results": {
                name: {cell: row.__dict__ for cell, row in rows.items()}
                for name, rows in results.items()
            },
            "ratios": ratios,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    failed = any(row.errors for rows in results.values() for row in rows.values())
    return 1 if failed or "letsinfer" in skipped else 0


if __name__ == "__main__":
    sys.exit(main())
