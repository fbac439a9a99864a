"""Eval runs as `eval runs` and `eval show` print them: one reading for the
CLI on the main and the admin API, so a controller prints the same."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from letsinfer.store.evals import EvalCaseRecord, EvalRunRecord


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def run_row(r: EvalRunRecord) -> dict[str, Any]:
    return {
        "run": r.id,
        "started": _when(r.started_at),
        "model": r.model,
        "group": r.pg,
        "suite": r.suite,
        "cases": r.cases,
        "score": round(r.score, 4),
        "threshold": r.threshold,
        "passed": r.passed,
    }


def case_row(c: EvalCaseRecord) -> dict[str, Any]:
    return {
        "case": c.index,
        "name": c.name,
        "scorer": c.scorer,
        "weight": c.weight,
        "score": round(c.score, 4),
        "note": c.note,
        "request_id": c.request_id,
        "status": c.status,
        "answer": c.answer,
        "duration_ms": c.duration_ms,
    }


def run_shown(r: EvalRunRecord, cases: list[EvalCaseRecord]) -> dict[str, Any]:
    """`eval show`: the run (with its suite's source) and each of its cases."""
    return {"run": {**run_row(r), "source": r.source}, "cases": [case_row(c) for c in cases]}


def no_run(run_id: str) -> str:
    return f"no eval run {run_id!r} (see `letsinfer eval runs`)"
