"""Prefix affinity on vs off, on two real llama.cpp engines.

    ./dev bench --prefix            # after the gateway benchmark
    python -m benchmarks.prefix [--short]

Two engines (placement groups) serve a generated ~29 M-parameter model
(benchmarks/benchmodel.py) with letsinfer's own launcher, one CPU thread
each. Clients send chat requests that share long system prompts (several
distinct prefixes, each followed by a short unique question), shuffled, a few
at a time, through letsinfer's gateway: once with prefix affinity, once
without (least-loaded choice only). Engines are restarted between the two
runs and each run uses its own prefixes, so neither inherits a warm cache.
It prints time to first token (first SSE event) and how many requests each
engine served.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from benchmarks.baselines import CACHE
from benchmarks.benchmodel import write_bench_model
from benchmarks.processes import Server, free_port
from letsinfer.gateway.engine_client import EngineClient

MODEL = "bench"


@dataclass(frozen=True)
class Plan:
    prefixes: int
    requests_per_prefix: int
    prefix_chars: int
    concurrency: int
    parallel: int  # slots per engine


FULL = Plan(prefixes=12, requests_per_prefix=6, prefix_chars=1600, concurrency=4, parallel=2)
SHORT = Plan(prefixes=3, requests_per_prefix=3, prefix_chars=600, concurrency=2, parallel=2)


def prompts(plan: Plan, seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def words(n_chars: int) -> str:
        out: list[str] = []
        size = 0
        while size < n_chars:
            word = "".join(rng.choice(letters) for _ in range(rng.randint(2, 8)))
            out.append(word)
            size += len(word) + 1
        return " ".join(out)[:n_chars]

    systems = [words(plan.prefix_chars) for _ in range(plan.prefixes)]
    requests = [
        json.dumps(
            {
                "model": MODEL,
                "stream": True,
                "max_tokens": 4,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {i}: " + words(40)},
                ],
            }
        )
        for system in systems
        for i in range(plan.requests_per_prefix)
    ]
    rng.shuffle(requests)
    return requests


def start_engine(model: Path, plan: Plan, work: Path, name: str) -> Server:
    port = free_port()
    spec = {
        "model": str(model),
        "alias": MODEL,
        "host": "127.0.0.1",
        "port": port,
        "threads": 1,
        "n_ctx": 2048 * plan.parallel,
        "parallel": plan.parallel,
        "embedding": False,
    }
    argv = [sys.executable, "-m", "letsinfer.engines.llamacpp_launcher", json.dumps(spec)]
    return Server(name, argv, port, work, ready_path="/health").start(timeout=120)


async def drive(url: str, key: str, bodies: list[str], concurrency: int) -> list[float]:
    client = EngineClient(10, 300)
    queue = list(bodies)
    ttft: list[float] = []

    async def worker() -> None:
        while queue:
            body = queue.pop().encode()
            started = time.perf_counter()
            response = await client.post(url, "/v1/chat/completions", body, authorization=key)
            first = await response.next_chunk()
            if response.status != 200 or first is None:
                raise RuntimeError(f"status {response.status}: {first!r}")
            ttft.append(time.perf_counter() - started)
            while await response.next_chunk() is not None:
                pass

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.aclose()
    return ttft


def run_mode(model: Path, plan: Plan, affinity: bool, seed: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="letsinfer-prefix-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        engines = []
        for i in range(2):
            engine = start_engine(model, plan, work, f"engine-{i}")
            stack.callback(engine.stop)
            engines.append(engine)
        port = free_port()
        key_file, access = work / "key", work / "access.log"
        argv = [sys.executable, "-m", "benchmarks.letsinfer_gateway", "--port", str(port)]
        for engine in engines:
            argv += ["--upstream", engine.url]
        argv += ["--model", MODEL, "--capacity", str(plan.parallel)]
        argv += ["--affinity-chars", "256" if affinity else "0"]
        argv += ["--home", str(work / "home"), "--key-file", str(key_file)]
        argv += ["--access-log", str(access)]
        gw = Server("letsinfer", argv, port, work, ready_path="/health").start()
        stack.callback(gw.stop)
        bodies = prompts(plan, seed)
        ttft = asyncio.run(
            drive(gw.url, f"Bearer {key_file.read_text().strip()}", bodies, plan.concurrency)
        )
        gw.stop()  # its last access-log lines are written once it has stopped
        loads = {"pg-0": 0, "pg-1": 0}
        for line in access.read_text().splitlines():
            for pg in loads:
                if f" pg={pg} " in line:
                    loads[pg] += 1
    mean_load = sum(loads.values()) / len(loads)
    return {
        "ttft_p50_ms": statistics.median(ttft) * 1000,
        "ttft_mean_ms": statistics.fmean(ttft) * 1000,
        "ttft_p90_ms": sorted(ttft)[int(0.9 * (len(ttft) - 1))] * 1000,
        "requests": len(ttft),
        "per_pg": loads,
        "max_over_mean_load": max(loads.values()) / mean_load if mean_load else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    plan = SHORT if args.short else FULL
    model = write_bench_model(CACHE / "bench-29m.gguf")
    print(
        f"prefix benchmark: {plan.prefixes} shared prefixes of {plan.prefix_chars} chars, "
        f"{plan.requests_per_prefix} requests each, {plan.concurrency} at a time, "
        f"2 llama.cpp engines x {plan.parallel} slots, 1 thread each",
        flush=True,
    )
    off = run_mode(model, plan, affinity=False, seed=1)
    on = run_mode(model, plan, affinity=True, seed=2)
    print(f"\n{'affinity':<9} {'ttft p50':>9} {'mean':>9} {'p90':>9}   per-PG requests  max/mean")
    for name, r in (("off", off), ("on", on)):
        print(
            f"{name:<9} {r['ttft_p50_ms']:>7.1f}ms {r['ttft_mean_ms']:>7.1f}ms "
            f"{r['ttft_p90_ms']:>7.1f}ms   {r['per_pg']}  {r['max_over_mean_load']:.2f}"
        )
    ratio = float(off["ttft_mean_ms"]) / float(on["ttft_mean_ms"])  # type: ignore[arg-type]
    print(
        f"\nmean TTFT off/on: {ratio:.2f}x (target 3x); max PG load / mean with affinity: "
        f"{on['max_over_mean_load']:.2f} (target <= 1.25)"
    )
    if args.json:
        args.json.write_text(json.dumps({"plan": plan.__dict__, "off": off, "on": on}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
