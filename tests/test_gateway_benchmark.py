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


@pytest.mark.timeout(900)
def test_the_short_gateway_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.gateway", "--short", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,  # the first run installs the LiteLLM proxy into its own venv
        cwd=Path(__file__).resolve().parent.parent,
    )
    print(run.stdout[-6000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stderr[-3000:]
    figures: dict[str, Any] = strict_json(out.read_text())
    # A baseline may only be missing when it could not be installed, and then loudly.
    for name, why in figures["skipped"].items():
        assert f"{name} SKIPPED: {why}" in run.stdout
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
    out = tmp_path / "zero.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.gateway", "--zero-delay", "--short", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    print(run.stdout[-6000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stderr[-3000:]
    figures: dict[str, Any] = strict_json(out.read_text())
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
