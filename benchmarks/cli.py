"""How long a `letsinfer` call takes, against `python -c pass` on the same
interpreter as the baseline: every call starts a fresh interpreter (people,
scripts, and the Ansible modules, which call it many times per host).

    python -m benchmarks.cli                # ./dev bench --cli; about a minute
    python -m benchmarks.cli --runs 5       # fewer rounds
    python -m benchmarks.cli --home DIR     # against a node already running there

Without --home it starts a main node of its own (loopback ports, a temporary
home) so that `status` and `model list` read a real authority and ask a
running node's admin socket, as they do on a user's machine, and stops it at
the end. Rounds interleave the commands (baseline, --help, status, ...), so
drift in the machine's load hits each alike; each figure is the median of
the rounds, with the fastest and the 90th percentile beside it.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.processes import free_port

BIN = Path(sys.executable).parent
LETSINFER = str(BIN / "letsinfer")
# Targets (issue 15): what "answers in a blink" means here.
TARGETS = {"letsinfer --help": 0.3, "letsinfer status": 0.5}


def commands(home: Path) -> dict[str, list[str]]:
    homed = [LETSINFER, "--home", str(home)]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "letsinfer --help": [LETSINFER, "--help"],
        "letsinfer --version": [LETSINFER, "--version"],
        "letsinfer status": [*homed, "status"],
        "letsinfer status --json": [*homed, "status", "--json"],
        "letsinfer model list": [*homed, "model", "list"],
        "letsinfer node list --json": [*homed, "node", "list", "--json"],
    }


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return took


def start_node(home: Path) -> subprocess.Popen[str]:
    port = free_port()
    env = {
        **os.environ,
        "LETSINFER_GATEWAY__HOST": "127.0.0.1",
        "LETSINFER_CONTROL__HOST": "127.0.0.1",
        "LETSINFER_CONTROL__PORT": str(free_port()),
        "LETSINFER_AGENT__API_HOST": "127.0.0.1",
        "LETSINFER_AGENT__API_PORT": str(free_port()),
        "LETSINFER_GATEWAY__METRICS_PORT": "0",
        "LETSINFER_DISCOVERY__ENABLED": "false",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [LETSINFER, "--home", str(home), "up", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("Ctrl-C"):
            break
    deadline = time.monotonic() + 120
    while (
        b"ready"
        not in subprocess.run(
            [LETSINFER, "--home", str(home), "status"], capture_output=True
        ).stdout
    ):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the benchmark's node did not become ready")
        time.sleep(0.5)
    return proc


def measure(home: Path, runs: int) -> dict[str, list[float]]:
    argvs = commands(home)
    for argv in argvs.values():  # warm the file cache; not counted
        timed(argv)
    times: dict[str, list[float]] = {name: [] for name in argvs}
    for _ in range(runs):
        for name, argv in argvs.items():
            times[name].append(timed(argv))
    return times


def report(times: dict[str, list[float]]) -> None:
    base = statistics.median(times["python -c pass"])
    print(f"{'command':28} {'median':>8} {'fastest':>8} {'p90':>8} {'over baseline':>14}  target")
    for name, samples in times.items():
        ordered = sorted(samples)
        median = statistics.median(ordered)
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        over = "" if name == "python -c pass" else f"+{median - base:.3f} s"
        target = TARGETS.get(name)
        verdict = "" if target is None else f"< {target} s: {'yes' if median < target else 'NO'}"
        print(f"{name:28} {median:7.3f}s {ordered[0]:7.3f}s {p90:7.3f}s {over:>14}  {verdict}")
    print(f"({len(times['python -c pass'])} rounds; seconds of wall clock per call)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="rounds (default 15)")
    parser.add_argument("--home", type=Path, help="a home whose node already runs")
    args = parser.parse_args()
    if args.home is not None:
        report(measure(args.home, args.runs))
        return
    with tempfile.TemporaryDirectory(prefix="letsinfer-bench-cli-") as tmp:
        home = Path(tmp) / "home"
        node = start_node(home)
        try:
            report(measure(home, args.runs))
        finally:
            node.send_signal(signal.SIGINT)
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()


if __name__ == "__main__":
    main()
