"""Running a suite: each case sent to the main's gateway as a real request
(its own path: keys, routing, records), its answer scored, the scores
weighed into one against the suite's threshold.

Cases run one after another (an eval measures answers, not throughput) at
temperature 0. Each request carries an id ``eval-<run>-<case>`` (so
``letsinfer request ID`` finds it) and the tag ``eval`` (so ``usage --by
tag`` counts eval traffic apart). A case the gateway refuses scores 0 with
the gateway's reason; a gateway that cannot be reached stops the run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from letsinfer.evals.scorers import Judge, Scored
from letsinfer.evals.suite import Case, Suite
from letsinfer.store.evals import EvalCaseRecord, EvalRunRecord

ANSWER_KEPT = 500  # characters of each answer kept with its case
GROUP_HEADER = "x-letsinfer-group"
TAG = "eval"
# A key made just now reaches the gateway at its next directory refresh.
KEY_WAIT_S = 15.0


class EvalError(RuntimeError):
    """The run could not be made (the gateway unreachable, the key refused)."""


@dataclass(frozen=True)
class Run:
    record: EvalRunRecord
    cases: list[EvalCaseRecord]


class Gateway:
    """The main's gateway as the runner uses it: chat completions with the eval key."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        timeout_s: float = 120.0,
        key_wait_s: float = 0.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = httpx.Client(
            timeout=timeout_s,
            headers={"authorization": f"Bearer {key}"},
            transport=transport,
        )
        self.key_wait_s = key_wait_s

    def close(self) -> None:
        self.client.close()

    def chat(
        self, body: dict[str, Any], request_id: str, group: str | None = None
    ) -> httpx.Response:
        headers = {"x-request-id": request_id, "x-letsinfer-tags": TAG}
        if group is not None:
            headers[GROUP_HEADER] = group
        url = self.base_url + "/v1/chat/completions"
        deadline = time.monotonic() + self.key_wait_s
        while True:
            try:
                response = self.client.post(url, json=body, headers=headers)
            except httpx.TransportError as exc:
                raise EvalError(f"cannot reach the gateway at {self.base_url}: {exc}") from exc
            if response.status_code != 401:
                self.key_wait_s = 0.0  # known now
                return response
            if time.monotonic() >= deadline:
                raise EvalError(
                    "the gateway refused the eval key (letsinfer:eval); is this node's "
                    "gateway running with this home's authority?"
                )
            time.sleep(0.3)


def _answer(response: httpx.Response) -> tuple[str | None, str]:
    """The answer's text, or None and why there is none."""
    try:
        body = response.json()
    except ValueError:
        return None, f"the gateway answered {response.status_code} (not JSON)"
    if response.status_code != 200:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return None, f"the gateway answered {response.status_code}: {str(message)[:300]}"
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None, "the answer has no message"
    return (content if isinstance(content, str) else ""), ""


def run_suite(
    suite: Suite,
    model: str,
    gateway: Gateway,
    group: str | None = None,
    progress: Callable[[EvalCaseRecord], None] = lambda case: None,
) -> Run:
    run_id = uuid.uuid4().hex[:12]
    started = time.time()
    cases: list[EvalCaseRecord] = []
    for index, case in enumerate(suite.cases, 1):
        done = _run_case(run_id, index, case, model, gateway, group)
        cases.append(done)
        progress(done)
    total = sum(c.weight for c in cases)
    score = sum(c.weight * c.score for c in cases) / total if total else 0.0
    record = EvalRunRecord(
        id=run_id,
        suite=suite.name,
        source=suite.source,
        model=model,
        pg=group,
        threshold=suite.threshold,
        score=round(score, 6),
        passed=score >= suite.threshold,
        cases=len(cases),
        started_at=started,
        finished_at=time.time(),
    )
    return Run(record, cases)


def _run_case(
    run_id: str, index: int, case: Case, model: str, gateway: Gateway, group: str | None
) -> EvalCaseRecord:
    request_id = f"eval-{run_id}-{index}"
    body: dict[str, Any] = {"model": model, "messages": case.messages, "temperature": 0}
    if case.max_tokens is not None:
        body["max_tokens"] = case.max_tokens
    began = time.perf_counter()
    response = gateway.chat(body, request_id, group)
    answer, why = _answer(response)
    if answer is None:
        scored = Scored(0.0, why)
    elif isinstance(case.scorer, Judge):
        scored = _judge(case, case.scorer, answer, gateway, request_id)
    else:
        scored = case.scorer.score(answer)
    return EvalCaseRecord(
        index=index,
        name=case.name,
        scorer=case.scorer.kind,
        weight=case.weight,
        score=scored.score,
        note=scored.note,
        request_id=request_id,
        status=response.status_code,
        answer=None if answer is None else answer[:ANSWER_KEPT],
        duration_ms=round((time.perf_counter() - began) * 1000, 2),
    )


def _judge(case: Case, judge: Judge, answer: str, gateway: Gateway, request_id: str) -> Scored:
    """The judge model (any model the cluster serves, never pinned) grades it."""
    body = {
        "model": judge.model,
        "messages": judge.question(case.messages, answer),
        "temperature": 0,
        "max_tokens": 8,
    }
    verdict, why = _answer(gateway.chat(body, request_id + "-judge"))
    if verdict is None:
        return Scored(0.0, f"the judge {judge.model} did not answer: {why}")
    return judge.read(verdict)
