"""The gateway benchmark runs end to end in its short mode, so it cannot rot.

Timings are not judged here (they live in the benchmark's own report); only
that every target ran and letsinfer's gateway answered every request.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def strict_json(text: str) -> dict[str, object]:
    """The --json file as a strict parser (jq, a browser) reads it: no NaN."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)  # type: ignore[no-any-return]


def run_benchmark(
    module: str, out: Path, *args: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``python -m MODULE ARGS --json OUT`` from the checkout: it must pass,
    and its figures are read back as strict JSON."""
    run = subprocess.run(
        [sys.executable, "-m", module, *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parent.parent,
    )
    print(run.stdout[-6000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stderr[-3000:]
    return run, strict_json(out.read_text())


@pytest.mark.timeout(600)
def test_the_short_gateway_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    # Without LiteLLM: its proxy is pip-installed from the index on first use (a
    # minute of CI, and a venv left in root's ~/.cache); nothing here checks it.
    run, figures = run_benchmark(
        "benchmarks.gateway", tmp_path / "bench.json", "--short", "--no-litellm", timeout=600
    )
    # A skipped baseline says so, and why.
    assert figures["skipped"] == {"litellm": "--no-litellm given"}
    assert "litellm SKIPPED: --no-litellm given" in run.stdout
    assert "nginx" not in figures["skipped"], "nginx is a test system package (tasks.py)"
    for cell, rows in figures["results"].items():
        ours = rows["letsinfer"]
        assert ours["errors"] == 0 and ours["completed"] > 0, cell
        assert rows["letsinfer-off"]["errors"] == 0, cell  # the A/B baseline ran too
        assert rows["letsinfer/letsinfer-off"]["throughput_ratio"] > 0, cell
        assert rows["direct"]["errors"] == 0, cell
        assert ours["rps"] > 0
    assert "targets at stream c=20:" in run.stdout


@pytest.mark.timeout(300)
def test_the_short_zero_delay_benchmark_runs_with_items_1_to_5_configured(
    tmp_path: Path,
) -> None:
    """The proxy-cost case (issue 16, item 6): every token at once, letsinfer
    with fallbacks, an adapter, bands, limits and a cache configured, beside
    nginx, the cheapest Python forwarder (the floor) and letsinfer's own work
    driven from protocol callbacks (an experiment)."""
    run, figures = run_benchmark(
        "benchmarks.gateway", tmp_path / "zero.json", "--zero-delay", "--short", timeout=300
    )
    assert figures["plan"]["interval_ms"] == 0
    assert "nginx" not in figures["skipped"]
    for cell, rows in figures["results"].items():
        assert set(rows) >= {"direct", "nginx", "floor", "letsinfer", "letsinfer/nginx"}, cell
        assert rows["floor/nginx"]["throughput_ratio"] > 0, cell  # a Python data path's ceiling
        names = ["direct", "nginx", "floor", "letsinfer"]
        if cell.startswith("plain"):  # the callback-driven experiment answers no stream
            names.append("callbacks")
        for name in names:
            assert rows[name]["errors"] == 0 and rows[name]["completed"] > 0, (cell, name)
        # what a request cost letsinfer's own process, from /proc
        assert rows["letsinfer"]["cpu_us_per_request"] > 0, cell
    assert "targets (zero delay):" in run.stdout
    assert "plain c=1: added p50 < 0.15 ms" in run.stdout


@pytest.mark.timeout(600)
def test_the_instruction_count_runs_every_proxy_under_callgrind(tmp_path: Path) -> None:
    """The count that does not move with the machine's load: each proxy under
    valgrind, every cell answered, a count per request for each."""
    _, figures = run_benchmark(
        "benchmarks.instructions", tmp_path / "instr.json", "--requests", "30", timeout=540
    )
    results = figures["results"]
    assert set(results) == {"nginx", "floor", "letsinfer"}
    for name, cells in results.items():
        assert set(cells) == {"plain c=1", "plain c=50", "stream c=1", "stream c=50"}, name
        for cell, row in cells.items():
            assert row["requests"] == 30 and row["errors"] == 0, (name, cell)
            assert row["instructions"] > 0, (name, cell)
    # The floor does less than letsinfer per request, whatever the machine.
    for cell, ratios in figures["ratios"].items():
        assert ratios["letsinfer/floor"] > 1, cell
