"""Eval runs' SQL (letsinfer.evals): every run of a suite against a model,
its score against its threshold, and each case's score, note, request id
and the start of its answer.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from letsinfer.store.plumbing import Plumbing


@dataclass(frozen=True)
class EvalRunRecord:
    id: str
    suite: str
    source: str  # the file or built-in suite it was read from
    model: str
    pg: str | None  # the placement group it was pinned to (None: any)
    threshold: float
    score: float
    passed: bool
    cases: int
    started_at: float
    finished_at: float


@dataclass(frozen=True)
class EvalCaseRecord:
    index: int  # 1-based, in the suite's order
    name: str
    scorer: str
    weight: float
    score: float
    note: str
    request_id: str | None
    status: int | None  # the gateway's answer (None: no answer)
    answer: str | None  # its first characters
    duration_ms: float


def _run(row: dict[str, Any]) -> EvalRunRecord:
    return EvalRunRecord(**{**row, "passed": bool(row["passed"])})


class EvalTables(Plumbing):
    if TYPE_CHECKING:

        def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...

    def add_eval_run(self, run: EvalRunRecord, cases: list[EvalCaseRecord]) -> None:
        """The run and its cases; the caller's transaction."""
        self._execute(
            "INSERT INTO eval_runs (id, suite, source, model, pg, threshold, score, passed, "
            "cases, started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run.id,
                run.suite,
                run.source,
                run.model,
                run.pg,
                run.threshold,
                run.score,
                int(run.passed),
                run.cases,
                run.started_at,
                run.finished_at,
            ),
        )
        for c in cases:
            self._execute(
                "INSERT INTO eval_cases (run_id, idx, name, scorer, weight, score, note, "
                "request_id, status, answer, duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run.id,
                    c.index,
                    c.name,
                    c.scorer,
                    c.weight,
                    c.score,
                    c.note,
                    c.request_id,
                    c.status,
                    c.answer,
                    c.duration_ms,
                ),
            )

    def list_eval_runs(self, model: str | None = None, limit: int = 100) -> list[EvalRunRecord]:
        """The latest runs first."""
        where, params = ("WHERE model = ? ", (model,)) if model else ("", ())
        rows = self._rows(
            f"SELECT * FROM eval_runs {where}ORDER BY started_at DESC LIMIT ?", (*params, limit)
        )
        return [_run(r) for r in rows]

    def get_eval_run(self, run_id: str) -> tuple[EvalRunRecord, list[EvalCaseRecord]] | None:
        """A run by its id (or a unique prefix of it) and its cases."""
        rows = self._rows(
            "SELECT * FROM eval_runs WHERE id = ? OR id LIKE ? ESCAPE '\\' LIMIT 2",
            (run_id, run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"),
        )
        exact = [r for r in rows if r["id"] == run_id]
        if exact:
            rows = exact
        if len(rows) != 1:
            return None
        run = _run(rows[0])
        cases = [
            EvalCaseRecord(
                r["idx"],
                r["name"],
                r["scorer"],
                r["weight"],
                r["score"],
                r["note"],
                r["request_id"],
                r["status"],
                r["answer"],
                r["duration_ms"],
            )
            for r in self._rows("SELECT * FROM eval_cases WHERE run_id = ? ORDER BY idx", (run.id,))
        ]
        return run, cases
