"""Capacity on demand: a cold model's first token, and a Zipf mix of more
models than GPUs.

    ./dev bench --capacity
    python -m benchmarks.capacity [--short] [--only cold|mix] [--min-resident 30s]

**Cold start.** One main on this machine's CPU runs the real embedded llama.cpp
engine (xllamacpp), as ``letsinfer up`` does. A model at ``--min 0`` is asked
for, streamed, through the gateway while unloaded; its time to the first token
is divided by what the engine alone needs: the same launcher the agent runs,
with the spec the agent gave it, started directly and timed to ``/health``
ready, plus a warm request's time to first token on it. Repeated, in turn;
medians. Goal: at most 1.2x.

**Zipf mix.** One main with two fake GPUs and the llama-server stand-in
(tests/llama_server_shim.py, run as a binary), six on-demand models that each
need a GPU, paced requests drawn from a Zipf distribution over them (fixed
seed). Run twice on fresh mains: letsinfer's policy (a minimum residence,
eviction by cost) and the baseline "load on every miss, evict the least
recently used" (``--min-resident 0s``, ``eviction = "lru"``). Loads are counted
from the audit chain's ``model.load`` records; wait is the client's latency.
Goal: at least 3x fewer loads and a lower p99 wait than the baseline. With
``--load-s``, the run ends with the fewest loads any policy needs to match the
baseline's p99 on the same schedule (benchmarks/capacity_bound.py), which says
whether both goals can hold together at all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.baselines import CACHE
from benchmarks.benchmodel import write_bench_model
from benchmarks.processes import Server, free_port
from letsinfer.engines.tinymodel import write_tiny_model

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "tests" / "llama_server_shim.py"
MODELS = 6
GPUS = 2
SEED = 20261204


@dataclass(frozen=True)
class Plan:
    cold_runs: int
    mix_seconds: float
    interval_s: float  # between two requests of the mix (open loop)
    zipf_s: float


FULL = Plan(cold_runs=5, mix_seconds=180, interval_s=1.0, zipf_s=1.0)
SHORT = Plan(cold_runs=3, mix_seconds=40, interval_s=1.0, zipf_s=1.0)


# -- a main on 127.0.0.1 ---------------------------------------------------------------
@dataclass
class Main:
    home: Path
    server: Server
    key: str
    env: dict[str, str]

    @property
    def url(self) -> str:
        return self.server.url

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "letsinfer", "--home", str(self.home), *args],
            capture_output=True,
            text=True,
            env=self.server.env,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"letsinfer {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def add_on_demand(self, name: str, gguf: Path, *policy: str) -> None:
        self.cli("model", "add", name, "--gguf", str(gguf), "--no-serve")
        self.cli("model", "scale", name, "--min", "0", *policy)

    def state(self, name: str) -> str:
        listed = httpx.get(f"{self.url}/v1/models", headers=self.auth(), timeout=10).json()
        return next(str(m["state"]) for m in listed["data"] if m["id"] == name)

    def loads(self) -> int:
        records = json.loads(self.cli("audit", "list", "--json"))
        return sum(1 for r in records if r["action"] == "model.load" and r["outcome"] == "ok")

    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}


@contextmanager
def running_main(root: Path, env: dict[str, str]) -> Iterator[Main]:
    port = free_port()
    env = {
        "PYTHONUNBUFFERED": "1",
        "LETSINFER_GATEWAY__HOST": "127.0.0.1",
        "LETSINFER_GATEWAY__PORT": str(port),
        "LETSINFER_GATEWAY__METRICS_PORT": "0",
        "LETSINFER_CONTROL__HOST": "127.0.0.1",
        "LETSINFER_CONTROL__PORT": str(free_port()),
        "LETSINFER_AGENT__API_HOST": "127.0.0.1",
        "LETSINFER_AGENT__API_PORT": str(free_port()),
        "LETSINFER_DISCOVERY__ENABLED": "false",
        "LETSINFER_GATEWAY__QUEUE_MAX_WAIT_S": "300",
        **env,
    }
    home = root / "main"
    argv = [sys.executable, "-m", "letsinfer", "--home", str(home), "up", "--name", "main"]
    server = Server("main", argv, port, root, env=env, ready_path="/health")
    server.start(timeout=180)
    try:
        # Its output goes to a file, so the banner names the key's file instead.
        text = server.log_path.read_text()
        found = re.search(r"API key\s+(li-\S+)", text)
        in_file = re.search(r"API key\s+in (\S+)", text)
        if found is not None:
            key = found.group(1)
        elif in_file is not None:
            key = Path(in_file.group(1)).read_text().strip()
        else:
            raise RuntimeError(f"no API key in the main's banner: {server.tail()}")
        yield Main(home, server, key, env)
    finally:
        server.stop()  # the agent stops its engines with it


# -- cold start ------------------------------------------------------------------------
def first_token_s(url: str, model: str, headers: dict[str, str]) -> float:
    """Seconds from sending a streamed chat request to its first SSE event."""
    body = {
        "model": model,
        "stream": True,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hello"}],
    }
    started = time.perf_counter()
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=300
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{model}: {response.status_code} {response.read()!r}")
        took = None
        for line in response.iter_lines():
            if took is None and line.startswith("data:"):
                took = time.perf_counter() - started
        if took is None:
            raise RuntimeError(f"{model}: no event in the stream")
        return took


def engine_spec(home: Path, model: str) -> dict[str, object]:
    """The launcher spec (its command line's last argument) of the engine the
    main under ``home`` runs for ``model``: the baseline starts the same one."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if b"letsinfer.engines.llamacpp_launcher" in argv and str(home).encode() in argv[-1]:
            spec = json.loads(argv[-1])
            if spec.get("alias") == model:  # not the main's built-in model's engine
                return spec  # type: ignore[no-any-return]
    raise RuntimeError(f"no engine of {model} runs under {home}")


def engine_alone(spec: dict[str, object], work: Path) -> tuple[float, float, float]:
    """The agent's own launcher with the same spec, started directly: (start
    to /health ready, the first request's time to first token, a warm one's)."""
    port = free_port()
    argv = [sys.executable, "-m", "letsinfer.engines.llamacpp_launcher"]
    argv.append(json.dumps({**spec, "port": port}))
    engine = Server("engine", argv, port, work, ready_path="/health")
    started = time.perf_counter()
    engine.start(timeout=180)
    try:
        ready = time.perf_counter() - started
        model = str(spec["alias"])
        first = first_token_s(engine.url, model, {})  # pays the engine's first compute
        warm = statistics.median(first_token_s(engine.url, model, {}) for _ in range(3))
        return ready, first, warm
    finally:
        engine.stop()


def wait_for(what: str, check: object, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting until {what}")
        time.sleep(0.2)


def cold_start(plan: Plan) -> dict[str, object]:
    model = write_bench_model(CACHE / "bench-29m.gguf")
    with tempfile.TemporaryDirectory(prefix="letsinfer-capacity-") as tmp:
        work = Path(tmp)
        letsinfer: list[float] = []
        alone: list[tuple[float, float, float]] = []
        with running_main(work, {}) as main:
            main.add_on_demand("cold", model, "--idle", "3s", "--min-resident", "0s")
            for run in range(plan.cold_runs):
                wait_for("cold is unloaded", lambda: main.state("cold") == "unloaded")
                time.sleep(2)  # the last engine's exit is not what this run measures
                letsinfer.append(first_token_s(main.url, "cold", main.auth()))
                spec = engine_spec(main.home, "cold")  # while it serves, before it idles out
                wait_for("cold is unloaded", lambda: main.state("cold") == "unloaded")
                time.sleep(2)
                alone.append(engine_alone(spec, work))
                print(
                    f"  run {run + 1}: letsinfer cold TTFT {letsinfer[-1]:.2f}s; engine alone "
                    f"ready {alone[-1][0]:.2f}s, first TTFT {alone[-1][1] * 1000:.0f}ms, "
                    f"warm TTFT {alone[-1][2] * 1000:.0f}ms",
                    flush=True,
                )
    return {
        "letsinfer_s": statistics.median(letsinfer),
        "ready_s": statistics.median(a[0] for a in alone),
        "first_ttft_s": statistics.median(a[1] for a in alone),
        "warm_ttft_s": statistics.median(a[2] for a in alone),
        "runs": len(letsinfer),
    }


# -- Zipf mix --------------------------------------------------------------------------
def fake_gpus(root: Path) -> dict[str, str]:
    gpus = [
        {"uuid": f"GPU-bench-{i}", "name": "Fake L4", "memory_total": 24 << 30} for i in range(GPUS)
    ]
    (root / "gpus.json").write_text(json.dumps(gpus))
    shim = root / "llama-server"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} {SHIM} "$@"\n')
    shim.chmod(0o755)
    return {
        "LETSINFER_HARDWARE__FAKE_GPUS": str(root / "gpus.json"),
        "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(shim),
    }


def schedule(plan: Plan) -> list[str]:
    """Which model each paced request asks for: Zipf over the models, seeded."""
    rng = random.Random(SEED)
    names = [f"m{i}" for i in range(1, MODELS + 1)]
    weights = [1 / rank**plan.zipf_s for rank in range(1, MODELS + 1)]
    return rng.choices(names, weights, k=int(plan.mix_seconds / plan.interval_s))


async def paced(url: str, headers: dict[str, str], models: list[str], interval: float) -> dict:
    """Send one request every ``interval`` seconds whatever the answers (an
    open loop); each one's latency and any failures."""
    waits: list[float] = []
    by_model: dict[str, list[float]] = {}
    failures: list[str] = []
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=1000)) as c:

        async def one(model: str) -> None:
            body = {
                "model": model,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
            }
            started = time.perf_counter()
            try:
                r = await c.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            except httpx.HTTPError as exc:
                failures.append(f"{model}: {exc!r}")
                return
            if r.status_code == 200:
                waits.append(time.perf_counter() - started)
                by_model.setdefault(model, []).append(waits[-1])
            else:
                failures.append(f"{model}: {r.status_code} {r.text[:200]}")

        tasks = []
        begun = time.perf_counter()
        for i, model in enumerate(models):
            await asyncio.sleep(max(0.0, begun + i * interval - time.perf_counter()))
            tasks.append(asyncio.create_task(one(model)))
        await asyncio.gather(*tasks)
        took = time.perf_counter() - begun
    return {"waits": waits, "by_model": by_model, "failures": failures, "seconds": took}


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def zipf_mix(plan: Plan, policy: list[str], env: dict[str, str]) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="letsinfer-capacity-") as tmp:
        work = Path(tmp)
        with running_main(work, {**fake_gpus(work), **env}) as main:
            for i in range(1, MODELS + 1):
                gguf = write_tiny_model(work / f"m{i}.gguf", name=f"tiny-m{i}")
                main.add_on_demand(f"m{i}", gguf, "--idle", "1h", *policy)
            before = main.loads()
            ran = asyncio.run(paced(main.url, main.auth(), schedule(plan), plan.interval_s))
            loads = main.loads() - before
    waits: list[float] = ran["waits"]
    for failure in ran["failures"][:5]:
        print(f"  FAILED {failure}", flush=True)
    return {
        "requests": len(waits) + len(ran["failures"]),
        "failures": len(ran["failures"]),
        "loads": loads,
        "loads_per_min": loads / (ran["seconds"] / 60),
        "p50_s": percentile(waits, 0.5),
        "p99_s": percentile(waits, 0.99),
        "max_s": max(waits, default=0.0),
        # Where the wait falls: the popular model's requests or the rare ones'.
        "by_model": {
            model: {"requests": len(w), "p50_s": percentile(w, 0.5), "p99_s": percentile(w, 0.99)}
            for model, w in sorted(ran["by_model"].items())
        },
    }


def report_cold(plan: Plan) -> dict[str, object]:
    print("\ncold start: first token of an unloaded model vs the engine alone", flush=True)
    cold = cold_start(plan)
    ours, ready = float(cold["letsinfer_s"]), float(cold["ready_s"])  # type: ignore[arg-type]
    first, warm = float(cold["first_ttft_s"]), float(cold["warm_ttft_s"])  # type: ignore[arg-type]
    cold["ratio"] = ours / (ready + warm)
    print(
        f"median of {cold['runs']}: letsinfer {ours:.2f}s; engine alone {ready:.2f}s ready + "
        f"{warm * 1000:.0f}ms warm TTFT = {ready + warm:.2f}s; ratio {cold['ratio']:.2f}x "
        f"(goal <= 1.2x)\n(against ready + the engine's first request, {ready + first:.2f}s, "
        f"which pays its first compute as a load does: {ours / (ready + first):.2f}x)",
        flush=True,
    )
    return cold


def report_mix(
    plan: Plan, min_resident: str, load_s: float, request_s: float
) -> dict[str, dict[str, object]]:
    loads = f"loads {load_s:g}s longer than the stand-in's" if load_s else "the stand-in's loads"
    answers = f"each answer holds a slot {request_s:g}s" if request_s else "answers at once"
    print(
        f"\nZipf mix: {MODELS} on-demand models, {GPUS} GPUs, a request every "
        f"{plan.interval_s:g}s for {plan.mix_seconds:g}s (Zipf s={plan.zipf_s:g}, seed {SEED}); "
        f"{loads}; {answers}",
        flush=True,
    )
    # The stand-in loads in about half a second (a real model takes seconds, a
    # GPU's share of a 7-8B model from the page cache, to minutes) and answers
    # in milliseconds (a GPU's decode takes seconds): the same for both rows.
    stand_in: dict[str, str] = {}
    if load_s:
        stand_in["LLAMA_SHIM_SLOW_START"] = f"{load_s:g}"
    if request_s:
        stand_in["LLAMA_SHIM_REQUEST_S"] = f"{request_s:g}"
    rows = {
        "lru, every miss": zipf_mix(
            plan, ["--min-resident", "0s"], {**stand_in, "LETSINFER_CAPACITY__EVICTION": "lru"}
        ),
        "letsinfer": zipf_mix(
            plan,
            ["--min-resident", min_resident],
            {**stand_in, "LETSINFER_CAPACITY__EVICTION": "cost"},
        ),
    }
    print(
        f"\n{'policy':<16} {'requests':>8} {'failed':>6} {'loads':>6} {'loads/min':>9} "
        f"{'p50 wait':>9} {'p99 wait':>9} {'max':>8}"
    )
    for name, r in rows.items():
        print(
            f"{name:<16} {r['requests']:>8} {r['failures']:>6} {r['loads']:>6} "
            f"{r['loads_per_min']:>9.1f} {r['p50_s']:>8.2f}s {r['p99_s']:>8.2f}s "
            f"{r['max_s']:>7.2f}s"
        )
        print(
            "  per model (requests, p50, p99): "
            + "; ".join(
                f"{m} {w['requests']}, {w['p50_s']:.1f}s, {w['p99_s']:.1f}s"
                for m, w in r["by_model"].items()  # type: ignore[attr-defined]
            )
        )
    base, ours = rows["lru, every miss"], rows["letsinfer"]
    fewer = float(base["loads"]) / max(float(ours["loads"]), 1.0)  # type: ignore[arg-type]
    p99 = float(base["p99_s"]) / max(float(ours["p99_s"]), 1e-9)  # type: ignore[arg-type]
    print(
        f"\nloads, baseline/letsinfer: {fewer:.2f}x (goal >= 3x); "
        f"p99 wait, baseline/letsinfer: {p99:.2f}x (goal > 1x)"
    )
    report_bound(plan, load_s, float(base["p99_s"]), int(base["loads"]))  # type: ignore[arg-type]
    return rows


def report_bound(plan: Plan, load_s: float, base_p99: float, base_loads: int) -> None:
    """Whether any policy could meet both goals on this schedule: the fewest
    loads that keep the p99 wait at the baseline's (benchmarks/capacity_bound.py)."""
    if load_s < plan.interval_s:
        print("bound: loads shorter than the interval between requests bound nothing")
        return
    try:
        from benchmarks.capacity_bound import mix_bound
    except ImportError:
        print("bound: skipped (highspy is not installed: pip install highspy)")
        return
    bound = mix_bound(
        schedule(plan), interval_s=plan.interval_s, load_s=load_s, within_s=base_p99, gpus=GPUS
    )
    print(
        f"bound: a p99 wait of {base_p99:.2f}s or less (the baseline's), for any policy, even "
        f"one that knows every request ahead: {bound.describe()}; 3x fewer loads than the "
        f"baseline is {base_loads // 3} or fewer"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--short", action="store_true", help="small counts: the mix for 40 s, 3 cold starts"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--only", choices=("cold", "mix"), help="run one of the two figures")
    parser.add_argument(
        "--min-resident", default="10s", help="letsinfer's --min-resident in the mix (10s)"
    )
    parser.add_argument(
        "--load-s",
        type=float,
        default=0.0,
        help="seconds each load of the mix takes on top of the stand-in's own (0)",
    )
    parser.add_argument(
        "--request-s",
        type=float,
        default=0.0,
        help="seconds each answer of the mix holds one of its engine's slots, as decode on a GPU "
        "does (0: the stand-in's own milliseconds)",
    )
    args = parser.parse_args(argv)
    plan = SHORT if args.short else FULL
    print(f"capacity benchmark on {os.cpu_count()} cores; {plan}", flush=True)
    figures: dict[str, object] = {"plan": plan.__dict__}
    if args.only != "mix":
        figures["cold"] = report_cold(plan)
    failed = False
    if args.only != "cold":
        figures["mix"] = rows = report_mix(plan, args.min_resident, args.load_s, args.request_s)
        failed = any(r["failures"] for r in rows.values())
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
