"""Eval suites: what a suite file says, read and checked before anything runs.

A suite is YAML (one document: ``name``, ``threshold``, ``cases``) or JSON
lines (``.jsonl``: the first line ``{"name": ..., "threshold": ...}``, then
one case per line). A case has ``messages`` (OpenAI chat messages), an
``expect`` naming exactly one scorer, and optionally ``name``, ``weight``
(default 1) and ``max_tokens``. Anything else is refused with the line and
field it is at (docs/evals.md).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from letsinfer.evals.scorers import SCORERS, Scorer, ScorerError, make_scorer

MAX_CASES = 1000
MAX_SUITE_BYTES = 4 * 1024 * 1024
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ROLES = frozenset({"system", "user", "assistant"})
_CASE_FIELDS = frozenset({"name", "messages", "expect", "weight", "max_tokens"})
_SUITE_FIELDS = frozenset({"name", "threshold", "cases", "judge_model"})
# The line of each mapping read from YAML (its key in the dict, taken out after).
_LINE = "__line__"


class SuiteError(ValueError):
    """A suite that cannot run: where (file, line, field) and why."""

    def __init__(self, source: str, line: int | None, where: str, why: str) -> None:
        at = f"{source}, line {line}" if line else source
        super().__init__(f"{at}: {where}: {why}" if where else f"{at}: {why}")


@dataclass(frozen=True)
class Case:
    name: str
    messages: list[dict[str, str]]
    scorer: Scorer
    weight: float = 1.0
    max_tokens: int | None = None


@dataclass(frozen=True)
class Suite:
    name: str
    threshold: float
    cases: list[Case] = field(default_factory=list)
    source: str = ""


class _LineLoader(yaml.SafeLoader):
    """Safe YAML, each mapping remembering its line."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        mapping[_LINE] = node.start_mark.line + 1
        return mapping


def builtin_names() -> list[str]:
    return sorted(
        p.name.removesuffix(".yaml") for p in _builtin_dir().iterdir() if p.name.endswith(".yaml")
    )


def _builtin_dir() -> Any:
    return resources.files("letsinfer.evals") / "suites"


def load(given: str) -> Suite:
    """A suite file's path, or the name of a built-in suite."""
    path = Path(given)
    if path.is_file():
        try:
            if path.stat().st_size > MAX_SUITE_BYTES:
                raise SuiteError(given, None, "", f"larger than {MAX_SUITE_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SuiteError(given, None, "", f"cannot be read: {exc}") from None
        return parse(text, given, jsonl=path.suffix in (".jsonl", ".ndjson"))
    builtin = _builtin_dir() / f"{given}.yaml"
    if _NAME.fullmatch(given) and builtin.is_file():
        return parse(builtin.read_text(encoding="utf-8"), f"built-in suite {given}")
    names = ", ".join(builtin_names())
    raise SuiteError(given, None, "", f"no such file, nor a built-in suite (built in: {names})")


def parse(text: str, source: str, *, jsonl: bool = False) -> Suite:
    if jsonl:
        return _from_jsonl(text, source)
    try:
        doc = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise SuiteError(
            source, line, "", f"not valid YAML: {getattr(exc, 'problem', exc)}"
        ) from None
    if not isinstance(doc, dict):
        raise SuiteError(source, 1, "", "a suite is a mapping with name, threshold and cases")
    _no_unknown(doc, source)
    cases = doc.get("cases")
    if not isinstance(cases, list) or not cases:
        raise SuiteError(source, doc.get(_LINE), "cases", "a non-empty list of cases is required")
    return _suite(doc, [(c.get(_LINE) if isinstance(c, dict) else None, c) for c in cases], source)


def _from_jsonl(text: str, source: str) -> Suite:
    rows: list[tuple[int, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise SuiteError(source, number, "", f"not valid JSON: {exc.msg}") from None
    if not rows:
        raise SuiteError(source, None, "", "empty: the first line names the suite")
    first_line, head = rows[0]
    if not isinstance(head, dict) or "messages" in head:
        raise SuiteError(
            source, first_line, "", 'the first line is the suite: {"name": ..., "threshold": ...}'
        )
    head = {**head, _LINE: first_line}
    if len(rows) == 1:
        raise SuiteError(source, first_line, "cases", "no case follows the first line")
    return _suite(
        head, [(n, {**c, _LINE: n} if isinstance(c, dict) else c) for n, c in rows[1:]], source
    )


def _suite(doc: dict[str, Any], cases: list[tuple[int | None, Any]], source: str) -> Suite:
    line = doc.get(_LINE)
    _no_unknown(doc, source)
    name = doc.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SuiteError(source, line, "name", "1-64 letters, digits, '.', '_' or '-' is required")
    threshold = doc.get("threshold")
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not 0 <= threshold <= 1
    ):
        raise SuiteError(source, line, "threshold", "a number from 0 to 1 is required")
    judge_model = doc.get("judge_model")
    if judge_model is not None and not isinstance(judge_model, str):
        raise SuiteError(source, line, "judge_model", "a model name is required")
    if len(cases) > MAX_CASES:
        raise SuiteError(source, line, "cases", f"at most {MAX_CASES} cases")
    read = [_case(i, at, c, source, judge_model) for i, (at, c) in enumerate(cases, 1)]
    if sum(c.weight for c in read) <= 0:
        raise SuiteError(source, line, "cases", "the weights sum to 0: nothing would be scored")
    return Suite(name, float(threshold), read, source)


def _no_unknown(doc: dict[str, Any], source: str) -> None:
    unknown = set(doc) - _SUITE_FIELDS - {_LINE}
    if unknown:
        raise SuiteError(
            source,
            doc.get(_LINE),
            sorted(unknown)[0],
            f"unknown field (known: {_known(_SUITE_FIELDS)})",
        )


def _known(fields: frozenset[str]) -> str:
    return ", ".join(sorted(fields))


def _case(index: int, line: int | None, raw: Any, source: str, judge_model: str | None) -> Case:
    where = f"case {index}"
    if not isinstance(raw, dict):
        raise SuiteError(source, line, where, "a case is a mapping with messages and expect")
    unknown = set(raw) - _CASE_FIELDS - {_LINE}
    if unknown:
        field_name = sorted(unknown)[0]
        raise SuiteError(
            source, line, f"{where}: {field_name}", f"unknown field (known: {_known(_CASE_FIELDS)})"
        )
    name = raw.get("name", f"case-{index}")
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise SuiteError(source, line, f"{where}: name", "a text of 1-200 characters")
    messages = raw.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SuiteError(
            source, line, f"{where}: messages", "a non-empty list of messages is required"
        )
    for m in messages:
        if (
            not isinstance(m, dict)
            or set(m) - {"role", "content", _LINE}
            or m.get("role") not in _ROLES
            or not isinstance(m.get("content"), str)
        ):
            raise SuiteError(
                source,
                m.get(_LINE, line) if isinstance(m, dict) else line,
                f"{where}: messages",
                "each message is {role: system|user|assistant, content: text}",
            )
    weight = raw.get("weight", 1)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not (math.isfinite(weight) and 0 <= weight <= 1000)
    ):
        raise SuiteError(source, line, f"{where}: weight", "a number from 0 to 1000")
    max_tokens = raw.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int)
        or not 1 <= max_tokens <= 32768
    ):
        raise SuiteError(source, line, f"{where}: max_tokens", "a whole number from 1 to 32768")
    expect = raw.get("expect")
    if not isinstance(expect, dict):
        raise SuiteError(
            source, line, f"{where}: expect", f"a mapping naming one scorer ({', '.join(SCORERS)})"
        )
    try:
        scorer = make_scorer(_plain(expect), judge_model)
    except ScorerError as exc:
        raise SuiteError(source, expect.get(_LINE, line), f"{where}: expect", str(exc)) from None
    clean = [{"role": m["role"], "content": m["content"]} for m in messages]
    return Case(name, clean, scorer, float(weight), max_tokens)


def _plain(value: Any) -> Any:
    """``value`` without the lines the YAML loader noted in its mappings."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != _LINE}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
