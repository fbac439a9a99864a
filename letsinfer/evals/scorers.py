"""How an eval case's answer is scored, 0 to 1: exact, contains, regex, a
number within a tolerance, a JSON schema, or a judge model with a rubric.

Each scorer is built from a case's ``expect`` mapping (checked then, so a
suite with a bad pattern or schema is refused before anything runs) and
scores an answer without side effects. The judge is the one that needs a
model: the runner asks it (:meth:`Judge.question`) and this module reads its
answer (:meth:`Judge.read`), strictly: a bare number from 0 to 1, or 0.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import jsonschema

SCORERS = ("exact", "contains", "regex", "number", "json_schema", "judge")
MAX_PATTERN = 2000
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
# A judge's whole answer: a number from 0 to 1 and nothing else.
_JUDGE_SCORE = re.compile(r"(?:0|1)(?:\.\d+)?|\.\d+")
_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n?```", re.DOTALL)


class ScorerError(ValueError):
    """An ``expect`` that names no scorer, several, or one with a bad argument."""


class Scored(NamedTuple):
    score: float  # 0..1
    note: str  # why, briefly (never the whole answer)


@dataclass(frozen=True)
class Exact:
    text: str
    kind = "exact"

    def score(self, answer: str) -> Scored:
        """The answer, less surrounding whitespace, is exactly the text."""
        if answer.strip() == self.text.strip():
            return Scored(1.0, "exact match")
        return Scored(0.0, "not the expected text")


@dataclass(frozen=True)
class Contains:
    text: str
    kind = "contains"

    def score(self, answer: str) -> Scored:
        if self.text in answer:
            return Scored(1.0, f"contains {self.text!r}")
        return Scored(0.0, f"does not contain {self.text!r}")


@dataclass(frozen=True)
class Regex:
    pattern: re.Pattern[str]
    kind = "regex"

    def score(self, answer: str) -> Scored:
        if self.pattern.search(answer):
            return Scored(1.0, "matches")
        return Scored(0.0, f"does not match /{self.pattern.pattern}/")


@dataclass(frozen=True)
class Number:
    value: float
    tolerance: float
    kind = "number"

    def score(self, answer: str) -> Scored:
        """The first number in the answer, within the tolerance of the value."""
        found = _NUMBER.search(answer.replace(",", ""))
        if found is None:
            return Scored(0.0, "no number in the answer")
        got = float(found[0])
        if math.isfinite(got) and abs(got - self.value) <= self.tolerance:
            return Scored(1.0, f"{found[0]} is within {self.tolerance:g} of {self.value:g}")
        return Scored(0.0, f"{found[0]} is not within {self.tolerance:g} of {self.value:g}")


@dataclass(frozen=True)
class JsonSchema:
    schema: dict[str, Any]
    kind = "json_schema"

    def score(self, answer: str) -> Scored:
        """The answer is JSON (alone, or in one ``` fence) valid under the schema."""
        text = answer.strip()
        fenced = _FENCE.fullmatch(text)
        if fenced:
            text = fenced[1]
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return Scored(0.0, f"not JSON: {exc.msg} at character {exc.pos}")
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(self.schema).iter_errors(doc)
        )
        if error is None:
            return Scored(1.0, "valid under the schema")
        where = "/".join(str(p) for p in error.absolute_path) or "(the document)"
        return Scored(0.0, f"invalid at {where}: {error.message[:200]}")


@dataclass(frozen=True)
class Judge:
    rubric: str
    model: str
    kind = "judge"

    def question(self, messages: list[dict[str, str]], answer: str) -> list[dict[str, str]]:
        """What the judge model is asked: the rubric, the conversation, the answer."""
        asked = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        return [
            {
                "role": "system",
                "content": "You grade answers. Reply with one number from 0 to 1 (1: fully "
                "meets the rubric, 0: not at all) and nothing else.",
            },
            {
                "role": "user",
                "content": f"Rubric:\n{self.rubric}\n\nConversation:\n{asked}\n\n"
                f"Answer to grade:\n{answer}\n\nScore (0 to 1):",
            },
        ]

    def read(self, verdict: str) -> Scored:
        """Strict: the verdict is a number from 0 to 1 and nothing else, or the
        case scores 0 (a judge that rambles is not trusted to have graded)."""
        text = verdict.strip()
        if _JUDGE_SCORE.fullmatch(text) and 0.0 <= float(text) <= 1.0:
            return Scored(float(text), f"judged {text} by {self.model}")
        shown = text if len(text) <= 60 else text[:60] + "..."
        return Scored(0.0, f"the judge {self.model} answered {shown!r}, not a score from 0 to 1")


Scorer = Exact | Contains | Regex | Number | JsonSchema | Judge


def _text(expect: dict[str, Any], name: str) -> str:
    value = expect[name]
    if not isinstance(value, str) or not value:
        raise ScorerError(f"{name}: a non-empty text is required")
    return value


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScorerError(f"{what}: a number is required")
    return float(value)


def make_scorer(expect: dict[str, Any], judge_model: str | None = None) -> Scorer:
    """The scorer a case's ``expect`` names; ``judge_model``: the suite's
    default judge. ScorerError when it names none, several, or is malformed."""
    named = [k for k in expect if k in SCORERS]
    extra = set(expect) - set(SCORERS) - {"tolerance"}
    if len(named) != 1 or extra:
        raise ScorerError(f"exactly one scorer is required, one of {', '.join(SCORERS)}")
    kind = named[0]
    if "tolerance" in expect and kind != "number":
        raise ScorerError("tolerance: only for the number scorer")
    if kind == "exact":
        return Exact(_text(expect, kind))
    if kind == "contains":
        return Contains(_text(expect, kind))
    if kind == "regex":
        pattern = _text(expect, kind)
        if len(pattern) > MAX_PATTERN:
            raise ScorerError(f"regex: at most {MAX_PATTERN} characters")
        try:
            return Regex(re.compile(pattern))
        except re.error as exc:
            raise ScorerError(f"regex: not a valid pattern: {exc}") from None
    if kind == "number":
        tolerance = _finite(expect.get("tolerance", 0), "tolerance")
        if tolerance < 0:
            raise ScorerError("tolerance: must not be negative")
        return Number(_finite(expect[kind], "number"), tolerance)
    if kind == "json_schema":
        schema = expect[kind]
        if not isinstance(schema, dict):
            raise ScorerError("json_schema: a JSON schema (a mapping) is required")
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.exceptions.SchemaError as exc:
            raise ScorerError(f"json_schema: not a valid schema: {exc.message[:200]}") from None
        return JsonSchema(schema)
    judge = expect[kind]
    if isinstance(judge, str):
        judge = {"rubric": judge}
    if not isinstance(judge, dict) or set(judge) - {"rubric", "model"}:
        raise ScorerError("judge: {rubric: text, model: name} (model: or the suite's judge_model)")
    rubric = judge.get("rubric")
    if not isinstance(rubric, str) or not rubric.strip():
        raise ScorerError("judge: rubric: a non-empty text is required")
    model = judge.get("model", judge_model)
    if not isinstance(model, str) or not model:
        raise ScorerError("judge: model: name the judge model (here or as the suite's judge_model)")
    return Judge(rubric, model)
