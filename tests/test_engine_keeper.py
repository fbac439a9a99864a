"""The keeper that runs an engine binary (llama-server) on its lease: a keeper
that is killed takes its engine with it at once, even an engine that would
take its time over a gentle stop (and keep its clients waiting meanwhile)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# An engine that ignores SIGTERM, as one busy with a graceful shutdown does,
# and says its pid once it is up.
LINGERING = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(os.getpid(), flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is not alive
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_killed_keeper_takes_its_engine_with_it(tmp_path: Path) -> None:
    keeper = subprocess.Popen(
        [sys.executable, "-m", "letsinfer.engines.keeper", "--", sys.executable, "-c", LINGERING],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert keeper.stdout is not None
    engine = int(keeper.stdout.readline())
    try:
        assert alive(engine)
        keeper.send_signal(signal.SIGKILL)
        keeper.wait()
        deadline = time.monotonic() + 30  # a bound for a slow machine, not a measured time
        while alive(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(engine), "the engine outlived its keeper"
    finally:
        if alive(engine):
            os.kill(engine, signal.SIGKILL)
