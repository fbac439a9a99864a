"""Gateway overhead: the same load sent directly to a mock engine, through nginx,
through the LiteLLM proxy and through letsinfer's gateway, in one run.

    ./dev bench                 # full run (about 5 minutes)
    ./dev bench --short         # small counts: what the test suite runs
    python -m benchmarks.gateway --json out.json
    python -m benchmarks.gateway --before ../main   # also another checkout's gateway
    ./dev bench --zero-delay    # the proxy's own cost: every token sent at once

The mock engine streams a fixed number of tokens at a fixed pace, so what
changes between rows is only the gateway in the path. For each load
(concurrency 1, 50, 200; streaming and not) it prints requests/s, the latency
added over the direct run (p50, p99), the time to first chunk added, and
errors; then the ratios letsinfer/LiteLLM and letsinfer/nginx. All servers
listen on 127.0.0.1 and are stopped at the end, whatever happens.

letsinfer runs as a main does: request records kept, replicas weighed by
fresh facts (two replicas on the mock). ``letsinfer-off`` is the same code
with both off, and ``--before DIR`` adds the gateway of another checkout
(say, the branch before a change) as ``before``; these A/B rows are measured
twice per cell in A-B-B-A order, so the machine's drift hits both alike,
and reported as ratios.

``--zero-delay``: the mock sends every token at once, so a request costs
what the proxies themselves cost; rows direct, nginx, floor (the cheapest
forwarder Python can be on letsinfer's stack, ``benchmarks/python_floor.py``:
the most any Python data path could reach), callbacks (not streaming only:
letsinfer's own work per request driven from protocol callbacks,
``benchmarks/callback_path.py``, an experiment) and letsinfer (as a main runs
it, with fallbacks, an adapter, bands, limits and a cache configured for
other keys and models: ``--breadth``), and ``before`` with ``--before``
(whose ``benchmarks/`` must know ``--breadth``: use this checkout's). Its
targets: throughput at least 0.9x nginx streaming and 0.6x not streaming at
50 and 200 clients, under 0.15 ms added at one client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks import baselines
from benchmarks.load import CellResult, run_cell
from benchmarks.processes import Server, free_port

PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Plan:
    concurrencies: tuple[int, ...]
    counts: dict[int, int]  # requests measured per concurrency
    max_s: float  # per cell
    tokens: int
    interval_ms: float


FULL = Plan((1, 50, 200), {1: 25, 50: 600, 200: 2000}, 8.0, tokens=16, interval_ms=20.0)
SHORT = Plan((1, 20), {1: 10, 20: 80}, 3.0, tokens=4, interval_ms=5.0)
# Bounded by time: thousands of requests a second per cell.
ZERO = Plan((1, 50, 200), {1: 20_000, 50: 60_000, 200: 60_000}, 4.0, tokens=16, interval_ms=0.0)


@dataclass
class Target:
    name: str
    url: str
    authorization: str = ""
    skipped: str = ""  # why this target did not run
    plain_only: bool = False  # measured in the cells that do not stream
    server: Server | None = None  # its processes, for their CPU time


AB = ("letsinfer-off", "before")  # baselines of the letsinfer row, measured A-B-B-A


def _body(stream: bool) -> bytes:
    request = {
        "model": "mock",
        "messages": [{"role": "user", "content": "Benchmark prompt: say something."}],
        "max_tokens": 16,
        "stream": stream,
    }
    return json.dumps(request).encode()


def start_gateway(
    name: str,
    work: Path,
    upstream: str,
    stack: contextlib.ExitStack,
    *flags: str,
    tree: Path | None = None,
    module: str = "benchmarks.letsinfer_gateway",
    plain_only: bool = False,
    wrap: tuple[str, ...] = (),
    start_timeout: float = 60,
) -> Target:
    """A letsinfer gateway (this checkout's, or ``tree``'s) with two replicas on
    the mock; ``module``: another server taking the same arguments; ``wrap``:
    a command that runs it (valgrind)."""
    port = free_port()
    key_file = work / f"{name}.key"
    gw = Server(
        name,
        [
            *wrap,
            sys.executable,
            "-m",
            module,
            "--port",
            str(port),
            "--upstream",
            upstream,
            "--upstream",
            upstream,
            "--home",
            str(work / f"{name}-home"),
            "--key-file",
            str(key_file),
            "--access-log",
            str(work / f"{name}-access.log"),
            *flags,
        ],
        port,
        work,
        ready_path="/health",
        env={"PYTHONPATH": str(tree)} if tree else None,
        cwd=tree,
    ).start(start_timeout)
    stack.callback(gw.stop)
    return Target(
        name, gw.url, f"Bearer {key_file.read_text().strip()}", plain_only=plain_only, server=gw
    )


def install_uvloop() -> None:
    """The load generator on uvloop, where installed: as cheap as it can be."""
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()


def start_mock(work: Path, plan: Plan) -> Server:
    """The mock engine, sending ``plan.tokens`` tokens ``plan.interval_ms`` apart."""
    mock_port = free_port()
    return Server(
        "mock",
        [
            sys.executable,
            "-m",
            "benchmarks.mock_upstream",
            "--port",
            str(mock_port),
            "--tokens",
            str(plan.tokens),
            "--interval-ms",
            str(plan.interval_ms),
        ],
        mock_port,
        work,
        ready_status=(404,),
    ).start()


def start_floor(
    work: Path, upstream: str, wrap: tuple[str, ...] = (), start_timeout: float = 60
) -> Server:
    """The cheapest Python forwarder (``benchmarks/python_floor.py``) in front of ``upstream``."""
    port = free_port()
    argv = [*wrap, sys.executable, "-m", "benchmarks.python_floor", "--port", str(port)]
    argv += ["--upstream", upstream]
    return Server("floor", argv, port, work, ready_status=(404,)).start(start_timeout)


def as_a_main(work: Path, name: str) -> tuple[str, ...]:
    """A letsinfer row's flags as a main runs it (request records of its own,
    facts), with items 1-5 configured: every letsinfer-like row alike."""
    return ("--records", str(work / f"{name}.db"), "--facts", "--breadth")


def start_targets(
    work: Path,
    plan: Plan,
    with_litellm: bool,
    stack: contextlib.ExitStack,
    before: Path | None = None,
    zero_delay: bool = False,
) -> list[Target]:
    mock = start_mock(work, plan)
    stack.callback(mock.stop)
    targets = [Target("direct", mock.url, server=mock)]

    try:
        proxy = baselines.nginx(mock.port, work)
        stack.callback(proxy.stop)
        targets.append(Target("nginx", proxy.url, server=proxy))
    except (baselines.Unavailable, RuntimeError) as exc:
        targets.append(Target("nginx", "", skipped=str(exc)))

    if zero_delay:  # letsinfer as a main runs it, with items 1-5 configured, against nginx
        floor = start_floor(work, mock.url)
        stack.callback(floor.stop)
        targets.append(Target("floor", floor.url, server=floor))

        def as_main(name: str) -> tuple[str, ...]:
            return as_a_main(work, name)

        # letsinfer's own work from protocol callbacks: an experiment, plain requests only
        module = "benchmarks.callback_path"
        targets.append(
            start_gateway(
                "callbacks",
                work,
                mock.url,
                stack,
                *as_main("callbacks"),
                module=module,
                plain_only=True,
            )
        )
        if before is not None:
            try:
                targets.append(
                    start_gateway(
                        "before",
                        work,
                        mock.url,
                        stack,
                        *as_main("before"),
                        tree=before.resolve(),
                    )
                )
            except RuntimeError as exc:
                targets.append(Target("before", "", skipped=str(exc)))
        targets.append(start_gateway("letsinfer", work, mock.url, stack, *as_main("letsinfer")))
        return targets

    if with_litellm:
        try:
            lite = baselines.litellm(mock.url, work)
            stack.callback(lite.stop)
            targets.append(
                Target("litellm", lite.url, f"Bearer {baselines.LITELLM_KEY}", server=lite)
            )
        except (baselines.Unavailable, RuntimeError) as exc:
            targets.append(Target("litellm", "", skipped=str(exc)))
    else:
        targets.append(Target("litellm", "", skipped="--no-litellm given"))

    targets.append(start_gateway("letsinfer-off", work, mock.url, stack))
    if before is not None:
        try:
            targets.append(start_gateway("before", work, mock.url, stack, tree=before.resolve()))
        except RuntimeError as exc:
            targets.append(Target("before", "", skipped=str(exc)))
    targets.append(
        start_gateway(
            "letsinfer", work, mock.url, stack, "--records", str(work / "requests.db"), "--facts"
        )
    )
    return targets


def measure(targets: list[Target], plan: Plan) -> dict[str, dict[str, CellResult]]:
    """results[cell][target], cells named like 'stream c=50'."""
    results: dict[str, dict[str, CellResult]] = {}
    for stream in (True, False):
        for c in plan.concurrencies:
            cell = f"{'stream' if stream else 'plain'} c={c}"
            results[cell] = {}

            def run(t: Target, stream: bool = stream, c: int = c) -> CellResult:
                warmup = min(c, 50)
                cpu_before = t.server.cpu_seconds() if t.server else 0.0
                result = asyncio.run(
                    run_cell(
                        t.url,
                        PATH,
                        _body(stream),
                        authorization=t.authorization,
                        stream=stream,
                        concurrency=c,
                        count=plan.counts[c],
                        max_s=plan.max_s,
                        warmup=warmup,
                    )
                )
                if t.server:  # what serving these requests cost the target itself
                    result.cpu_s = t.server.cpu_seconds() - cpu_before
                    result.sent = result.completed + result.errors + warmup
                return result

            live = [t for t in targets if not t.skipped and not (stream and t.plain_only)]
            for t in live:
                results[cell][t.name] = run(t)
            # The A/B pairs once more, in reverse order: A-B-B-A.
            for t in reversed([t for t in live if t.name in (*AB, "letsinfer")]):
                results[cell][t.name] = results[cell][t.name].merged(run(t))
    return results


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.2f}"


def report(targets: list[Target], results: dict[str, dict[str, CellResult]]) -> dict[str, object]:
    summary: dict[str, object] = {}
    for t in targets:
        if t.skipped:
            print(f"\n!!! {t.name} SKIPPED: {t.skipped}\n")
    header = (
        f"{'target':<14} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} "
        f"{'+p99 ms':>8} {'ttfc ms':>8} {'+ttfc ms':>8} {'errors':>6} {'cpu us':>7}"
    )
    for cell, by_target in results.items():
        print(f"\n== {cell}\n{header}")
        direct = by_target.get("direct")
        rows: dict[str, dict[str, float | None]] = {}
        for name, r in by_target.items():
            added50 = r.p(0.5) - direct.p(0.5) if direct else float("nan")
            added99 = r.p(0.99) - direct.p(0.99) if direct else float("nan")
            added_first = r.first_p(0.5) - direct.first_p(0.5) if direct else float("nan")
            cpu = r.cpu_per_request_s * 1e6  # NaN: too little CPU in the cell to tell
            rows[name] = {
                "rps": r.rps,
                "p50_ms": r.p(0.5) * 1000,
                "p99_ms": r.p(0.99) * 1000,
                "added_p50_ms": added50 * 1000,
                "added_p99_ms": added99 * 1000,
                "first_chunk_p50_ms": r.first_p(0.5) * 1000,
                "added_first_chunk_ms": added_first * 1000,
                "errors": r.errors,
                "completed": r.completed,
                # the target's own processes: CPU time per request it served
                # (null, not NaN, when not measured: NaN is not JSON)
                "cpu_us_per_request": None if math.isnan(cpu) else cpu,
            }
            print(
                f"{name:<14} {r.rps:>8.1f} {_ms(r.p(0.5)):>8} {_ms(r.p(0.99)):>8} "
                f"{_ms(added50):>8} {_ms(added99):>8} {_ms(r.first_p(0.5)):>8} "
                f"{_ms(added_first):>8} {r.errors:>6} {'-' if math.isnan(cpu) else f'{cpu:.1f}':>7}"
            )
            if r.errors:
                print(f"{'':<14} first error: {r.first_error}")
        ours = by_target.get("letsinfer")
        ratios = []
        for base in AB:
            if ours and base in by_target and by_target[base].rps:
                ratio = ours.rps / by_target[base].rps
                delta = (ours.p(0.5) - by_target[base].p(0.5)) * 1000  # the added p50s' difference
                rows[f"letsinfer/{base}"] = {
                    "throughput_ratio": ratio,
                    "added_p50_delta_ms": delta,
                    "p50_ratio": ours.p(0.5) / by_target[base].p(0.5),
                }
                ratios.append(
                    f"letsinfer/{base} throughput {ratio:.3f}x, p50 "
                    f"{ours.p(0.5) / by_target[base].p(0.5):.3f}x, added p50 {delta:+.2f} ms"
                )
        for other in ("litellm", "nginx", "floor"):
            if ours and other in by_target and by_target[other].rps:
                ratio = ours.rps / by_target[other].rps
                rows[f"letsinfer/{other}"] = {"throughput_ratio": ratio}
                ratios.append(f"letsinfer/{other} throughput {ratio:.2f}x")
        # CPU per request against each baseline: the proxy's own cost, less
        # tied than throughput to how the machine shares its cores out
        for other in ("nginx", "floor", *AB):
            if ours and other in by_target:
                cpu = ours.cpu_per_request_s / by_target[other].cpu_per_request_s
                if not math.isnan(cpu):
                    rows.setdefault(f"letsinfer/{other}", {})["cpu_per_request_ratio"] = cpu
                    ratios.append(f"letsinfer/{other} cpu per request {cpu:.2f}x")
        nginx = by_target.get("nginx")
        for other in ("floor", "callbacks"):  # the floor: the most a Python data path reaches
            if other in by_target and nginx and nginx.rps:
                ratio = by_target[other].rps / nginx.rps
                rows[f"{other}/nginx"] = {"throughput_ratio": ratio}
                ratios.append(f"{other}/nginx throughput {ratio:.2f}x")
        if ratios:
            print("  " + ";  ".join(ratios))
        summary[cell] = rows
    return summary


def targets_check(summary: dict[str, object], cell: str) -> list[str]:
    """The issue's targets, judged on one cell (the heaviest streaming load)."""
    rows = summary.get(cell)
    if not isinstance(rows, dict) or "letsinfer" not in rows:
        return []
    ours = rows["letsinfer"]
    lines = [
        ("added p50 < 0.5 ms", ours["added_p50_ms"] < 0.5, f"{ours['added_p50_ms']:.2f} ms"),
        ("added p99 < 2 ms", ours["added_p99_ms"] < 2.0, f"{ours['added_p99_ms']:.2f} ms"),
    ]
    if "letsinfer/litellm" in rows:
        r = rows["letsinfer/litellm"]["throughput_ratio"]
        lines.append(("throughput >= 3x LiteLLM", r >= 3.0, f"{r:.2f}x"))
    if "letsinfer/nginx" in rows:
        r = rows["letsinfer/nginx"]["throughput_ratio"]
        lines.append(("throughput >= 0.75x nginx", r >= 0.75, f"{r:.2f}x"))
    return [f"  {'met' if ok else 'MISSED':<6} {name}: {value}" for name, ok, value in lines]


def zero_delay_check(summary: dict[str, object]) -> list[str]:
    """The zero-delay targets (issue 16, item 6), judged cell by cell."""
    lines = []
    for cell, rows in summary.items():
        if not isinstance(rows, dict) or "letsinfer" not in rows:
            continue
        stream, c = cell.split(" c=")
        if c == "1":
            added = rows["letsinfer"]["added_p50_ms"]
            lines.append((f"{cell}: added p50 < 0.15 ms", added < 0.15, f"{added:.3f} ms"))
        elif "letsinfer/nginx" in rows:
            goal = 0.9 if stream == "stream" else 0.6
            r = rows["letsinfer/nginx"]["throughput_ratio"]
            lines.append((f"{cell}: throughput >= {goal}x nginx", r >= goal, f"{r:.2f}x"))
    return [f"  {'met' if ok else 'MISSED':<6} {name}: {value}" for name, ok, value in lines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="small counts (CI)")
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM proxy")
    parser.add_argument(
        "--zero-delay",
        action="store_true",
        help="the proxy's own cost (every token at once), against nginx and Python floors",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--before", type=Path, help="another letsinfer checkout to measure beside this one"
    )
    args = parser.parse_args(argv)
    plan = ZERO if args.zero_delay else SHORT if args.short else FULL
    if args.zero_delay and args.short:
        plan = Plan((1, 20), {1: 2000, 20: 4000}, 1.0, tokens=4, interval_ms=0.0)
    install_uvloop()

    print(
        f"gateway benchmark ({'short' if args.short else 'full'}"
        f"{', zero delay' if args.zero_delay else ''}): mock engine streams "
        f"{plan.tokens} tokens {plan.interval_ms:g} ms apart; {os.cpu_count()} CPUs",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="letsinfer-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work = Path(tmp)
        targets = start_targets(
            work, plan, not args.no_litellm, stack, args.before, args.zero_delay
        )
        results = measure(targets, plan)
        summary = report(targets, results)
    if args.zero_delay:
        print("\ntargets (zero delay):")
        checks = zero_delay_check(summary)
    else:
        heaviest = f"stream c={plan.concurrencies[-1]}"
        print(f"\ntargets at {heaviest}:")
        checks = targets_check(summary, heaviest)
    for line in checks or ["  (letsinfer did not run)"]:
        print(line)
    skipped = {t.name: t.skipped for t in targets if t.skipped}
    if args.json:
        payload = {"plan": plan.__dict__, "skipped": skipped, "results": summary}
        args.json.write_text(json.dumps(payload, indent=2, default=str))
    ours_failed = any(
        cell.get("letsinfer", {}).get("errors", 0)
        for cell in summary.values()
        if isinstance(cell, dict)
    )
    return 1 if ours_failed else 0


if __name__ == "__main__":
    sys.exit(main())
