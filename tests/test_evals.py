"""Eval suites (letsinfer.evals, `letsinfer eval`): each scorer, suite files
read or refused with their line and field, and suites run on a real main
node through its gateway: score, exit status, runs kept and shown, the
requests' records and tags, group pinning for the eval key only."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from letsinfer.engines.tinymodel import SENTENCE
from letsinfer.evals.runner import Gateway, run_suite
from letsinfer.evals.scorers import (
    Contains,
    Exact,
    JsonSchema,
    Judge,
    Number,
    Regex,
    ScorerError,
    make_scorer,
)
from letsinfer.evals.suite import SuiteError, builtin_names, load, parse
from tests.nodes import RunningNode

SMOKE = """\
name: smoke
threshold: 0.9
cases:
  - messages: [{role: user, content: "Say hello"}]
    expect: {contains: "Hello"}
"""


# -- scorers ----------------------------------------------------------------
def test_exact_and_contains() -> None:
    assert Exact("Paris").score("  Paris\n").score == 1.0
    assert Exact("Paris").score("Paris, France").score == 0.0
    assert Contains("Hello").score(SENTENCE).score == 1.0
    assert Contains("hello").score(SENTENCE).score == 0.0  # case matters


def test_regex() -> None:
    scorer = make_scorer({"regex": r"tiny\s+model"})
    assert isinstance(scorer, Regex) and scorer.score(SENTENCE).score == 1.0
    assert scorer.score("a big model").score == 0.0
    with pytest.raises(ScorerError, match="not a valid pattern"):
        make_scorer({"regex": "(unclosed"})


def test_number_within_its_tolerance() -> None:
    scorer = make_scorer({"number": 3.5, "tolerance": 0.1})
    assert isinstance(scorer, Number)
    assert scorer.score("It is 3.55.").score == 1.0
    assert scorer.score("3.7").score == 0.0
    assert scorer.score("about three").score == 0.0
    assert make_scorer({"number": 1000}).score("1,000 exactly").score == 1.0
    assert make_scorer({"number": -2}).score("-2").score == 1.0
    with pytest.raises(ScorerError, match="tolerance"):
        make_scorer({"number": 1, "tolerance": -1})
    with pytest.raises(ScorerError, match="only for the number scorer"):
        make_scorer({"contains": "x", "tolerance": 1})


def test_json_schema() -> None:
    schema = {"type": "object", "required": ["age"], "properties": {"age": {"type": "integer"}}}
    scorer = make_scorer({"json_schema": schema})
    assert isinstance(scorer, JsonSchema)
    assert scorer.score('{"age": 36}').score == 1.0
    assert scorer.score('```json\n{"age": 36}\n```').score == 1.0
    wrong = scorer.score('{"age": "old"}')
    assert wrong.score == 0.0 and "age" in wrong.note
    assert scorer.score("Sure! Here it is").note.startswith("not JSON")
    with pytest.raises(ScorerError, match="not a valid schema"):
        make_scorer({"json_schema": {"type": "no-such-type"}})


def test_a_judge_verdict_is_read_strictly() -> None:
    judge = make_scorer({"judge": {"rubric": "Is it polite?", "model": "tiny"}})
    assert isinstance(judge, Judge)
    assert judge.read(" 0.75\n").score == 0.75
    assert judge.read("1").score == 1.0 and judge.read("0").score == 0.0
    for rambling in ["0.8 because it is polite", "Score: 0.9", "1.5", "-0.1", "high", ""]:
        assert judge.read(rambling).score == 0.0, rambling
    assert "not a score" in judge.read("Score: 0.9").note
    asked = judge.question([{"role": "user", "content": "Say hello"}], "Hello!")
    assert "Is it polite?" in asked[-1]["content"] and "Hello!" in asked[-1]["content"]
    with pytest.raises(ScorerError, match="name the judge model"):
        make_scorer({"judge": "Is it polite?"})
    assert make_scorer({"judge": "Is it polite?"}, judge_model="big").model == "big"  # type: ignore[union-attr]


def test_an_expect_names_exactly_one_scorer() -> None:
    with pytest.raises(ScorerError, match="exactly one scorer"):
        make_scorer({"contains": "a", "exact": "a"})
    with pytest.raises(ScorerError, match="exactly one scorer"):
        make_scorer({"equals": "a"})


# -- suites -----------------------------------------------------------------
def test_the_smallest_suite_reads_as_written() -> None:
    suite = parse(SMOKE, "smoke.yaml")
    assert suite.name == "smoke" and suite.threshold == 0.9
    (case,) = suite.cases
    assert case.messages == [{"role": "user", "content": "Say hello"}]
    assert case.scorer == Contains("Hello") and case.weight == 1.0


def test_a_suite_in_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(
        '{"name": "lines", "threshold": 0.5}\n'
        '{"messages": [{"role": "user", "content": "hi"}], "expect": {"exact": "x"}}\n'
        "\n"
        '{"messages": [{"role": "user", "content": "2+2"}], "expect": {"number": 4}, '
        '"weight": 3}\n'
    )
    suite = load(str(path))
    assert suite.name == "lines" and [c.weight for c in suite.cases] == [1.0, 3.0]
    path.write_text(
        '{"name": "lines", "threshold": 0.5}\n'
        '{"messages": [{"role": "user", "content": "hi"}], "expect": {"exact": "x"}}\n'
        '{"messages": [{"role": "user", "content": "hi"}], "expect": {"regex": "("}}\n'
    )
    with pytest.raises(SuiteError, match=r"line 3: case 2: expect: regex: not a valid pattern"):
        load(str(path))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (SMOKE.replace("threshold: 0.9", "threshold: 9"), r"line 1: threshold: a number from 0"),
        (SMOKE.replace("expect:", "expected:"), r"line 4: case 1: expect(ed)?: "),
        (
            SMOKE.replace('{contains: "Hello"}', '{has: "Hello"}'),
            r"line 5: case 1: expect: exactly",
        ),
        (SMOKE.replace("role: user", "role: robot"), r"line 4: case 1: messages: each message"),
        (SMOKE + "    weight: -1\n", r"line 4: case 1: weight: a number from 0 to 1000"),
        (SMOKE.replace("cases:", "kases:"), r"line 1: kases: unknown field"),
        ("name: smoke\nthreshold: 0.9\ncases: [\n", r"line \d+: not valid YAML"),
        ("name: smoke\nthreshold: 0.9\ncases: []\n", r"line 1: cases: a non-empty list"),
    ],
)
def test_a_malformed_suite_is_refused_with_its_line_and_field(text: str, says: str) -> None:
    with pytest.raises(SuiteError, match=says) as refused:
        parse(text, "bad.yaml")
    assert str(refused.value).startswith("bad.yaml, line ")


def test_the_built_in_suites_load_by_name() -> None:
    assert builtin_names() == ["arithmetic", "json-format"]
    arithmetic, formats = load("arithmetic"), load("json-format")
    assert {c.scorer.kind for c in arithmetic.cases} == {"number"}
    assert {c.scorer.kind for c in formats.cases} == {"json_schema"}
    with pytest.raises(SuiteError, match="nor a built-in suite"):
        load("no-such-suite")


# -- the runner, against a gateway that answers as told ----------------------
def test_cases_are_weighed_into_one_score_and_a_refusal_scores_zero() -> None:
    answers = {"q1": "Hello there", "q2": "42", "q3": "nope"}

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["model"] == "judge":
            return httpx.Response(200, json={"choices": [{"message": {"content": "0.5"}}]})
        asked = body["messages"][-1]["content"]
        assert request.headers["x-letsinfer-tags"] == "eval"
        assert request.headers["x-letsinfer-group"] == "pg-1"
        if asked == "q4":
            return httpx.Response(503, json={"error": {"message": "no healthy replica"}})
        return httpx.Response(200, json={"choices": [{"message": {"content": answers[asked]}}]})

    suite = parse(
        """
name: mixed
threshold: 0.5
cases:
  - {messages: [{role: user, content: q1}], expect: {contains: Hello}}
  - {messages: [{role: user, content: q2}], expect: {number: 42}, weight: 2}
  - {messages: [{role: user, content: q3}], expect: {exact: "yes"}}
  - {messages: [{role: user, content: q4}], expect: {contains: x}}
  - {messages: [{role: user, content: q1}], expect: {judge: {rubric: r, model: judge}}, weight: 2}
""",
        "mixed.yaml",
    )
    gateway = Gateway("http://gw", "li-x", transport=httpx.MockTransport(answer))
    done = run_suite(suite, "m", gateway, group="pg-1")
    assert [c.score for c in done.cases] == [1.0, 1.0, 0.0, 0.0, 0.5]
    assert done.record.score == pytest.approx((1 + 2 + 0 + 0 + 2 * 0.5) / 7)
    assert done.record.passed and done.record.pg == "pg-1"
    assert "503" in done.cases[3].note and "no healthy replica" in done.cases[3].note
    assert done.cases[4].note == "judged 0.5 by judge"


# -- end to end, on a real main node ----------------------------------------
def _cli_json(node: RunningNode, *args: str) -> Any:
    done = node.cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _record(node: RunningNode, request_id: str) -> Any:
    """`request ID --json`, once the record is written (about a second after the answer)."""
    deadline = time.monotonic() + 10
    while (done := node.cli("request", request_id, "--json")).returncode != 0:
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.3)
    return json.loads(done.stdout)


MIXED = """\
name: mixed
threshold: 0.9
cases:
  - name: greets
    messages: [{role: user, content: "Say hello"}]
    expect: {contains: "Hello"}
  - name: names itself
    weight: 2
    messages: [{role: user, content: "What are you?"}]
    expect: {regex: "tiny\\\\s+model"}
  - name: says goodbye
    messages: [{role: user, content: "Say goodbye"}]
    expect: {exact: "Goodbye!"}
  - name: judged
    messages: [{role: user, content: "Be polite"}]
    expect: {judge: {rubric: "Is the answer polite?", model: tiny}}
"""


def test_suites_run_through_the_gateway_and_are_kept(
    main_node: RunningNode, tmp_path: Path
) -> None:
    main_node.wait_healthy()
    smoke = tmp_path / "smoke.yaml"
    smoke.write_text(SMOKE)
    passed = main_node.cli("eval", "tiny", "--suite", str(smoke))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "score 1.0000, threshold 0.9: passed" in passed.stdout

    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(MIXED)
    failed = main_node.cli("eval", "tiny", "--suite", str(mixed), "--json")
    assert failed.returncode == 1, failed.stderr
    run = json.loads(failed.stdout)
    # 1 + 2 of 5: the exact case fails, and the tiny model as its own judge
    # answers its sentence, not a score: read strictly, that is 0.
    assert run["score"] == 0.6 and run["passed"] is False and run["suite"] == "mixed"
    assert [c["score"] for c in run["cases"]] == [1.0, 1.0, 0.0, 0.0]
    assert "not a score" in run["cases"][3]["note"]
    assert run["cases"][0]["answer"] == SENTENCE

    runs = _cli_json(main_node, "eval", "runs")
    assert [(r["suite"], r["passed"]) for r in runs[:2]] == [("mixed", False), ("smoke", True)]
    table = main_node.cli("eval", "runs")
    assert table.returncode == 0 and run["run"] in table.stdout
    shown = _cli_json(main_node, "eval", "show", run["run"][:6])
    assert shown["run"] == run["run"] and shown["source"] == str(mixed)
    assert [c["name"] for c in shown["cases"]] == [
        "greets", "names itself", "says goodbye", "judged"
    ]  # fmt: skip
    assert main_node.cli("eval", "show", "nosuchrun").returncode == 1

    # Each case was a real request, recorded under the eval key with its tag.
    request_id = run["cases"][1]["request_id"]
    assert request_id == f"eval-{run['run']}-2"
    [record] = _cli_json(main_node, "request", request_id)
    assert record["key"] == "letsinfer:eval" and record["tags"] == ["eval"]
    assert record["model"] == "tiny" and record["status"] == 200

    audited = [r for r in _cli_json(main_node, "audit", "list") if r["action"] == "eval.run"]
    assert f"run={run['run']}" in audited[-1]["detail"]
    assert "score=0.6000" in audited[-1]["detail"] and "passed=no" in audited[-1]["detail"]
    assert audited[-1]["target"] == "tiny"


def test_a_malformed_suite_or_unknown_model_is_refused_before_any_request(
    main_node: RunningNode, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SMOKE.replace('{contains: "Hello"}', '{regex: "("}'))
    done = main_node.cli("eval", "tiny", "--suite", str(bad))
    assert done.returncode == 2
    assert re.search(r"bad\.yaml, line 5: case 1: expect: regex: not a valid pattern", done.stderr)
    done = main_node.cli("eval", "nosuchmodel", "--suite", "arithmetic")
    assert done.returncode == 2 and "no model 'nosuchmodel'" in done.stderr
    done = main_node.cli("eval", "tiny", "--suite", "arithmetic", "--group", "pg-nope")
    assert done.returncode == 2 and "has no placement group 'pg-nope'" in done.stderr


def test_group_pinning_is_for_the_eval_key_only(main_node: RunningNode, tmp_path: Path) -> None:
    main_node.wait_healthy()
    shown = _cli_json(main_node, "model", "show", "tiny")
    group = shown["placement_groups"][0]["id"]
    smoke = tmp_path / "smoke.yaml"
    smoke.write_text(SMOKE)
    run = _cli_json(main_node, "eval", "tiny", "--suite", str(smoke), "--group", group)
    assert run["group"] == group and run["passed"] is True
    [record] = _record(main_node, run["cases"][0]["request_id"])
    assert record["placement_group"] == group

    # Any other key naming a group is refused, on either request path
    # (the second request finds a kept engine connection: the express lane's).
    with httpx.Client(base_url=main_node.url) as client:
        for _ in range(2):
            refused = client.post(
                "/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {main_node.key}", "x-letsinfer-group": group},
            )
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "group_pin_refused"
            assert (
                client.post(
                    "/v1/chat/completions",
                    json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"authorization": f"Bearer {main_node.key}"},
                ).status_code
                == 200
            )
    # A key reaching for a group is a denial in the audit chain.
    deadline = time.monotonic() + 10
    while True:
        records = _cli_json(main_node, "audit", "list")
        if any(
            r["action"] == "gateway.request" and "group_pin_refused" in str(r["detail"])
            for r in records
        ):
            break
        assert time.monotonic() < deadline, "a refused pin is audited"
        time.sleep(0.3)


def tag_counts(node: RunningNode) -> dict[str, int]:
    """Requests per tag in `usage --by tag`: none before the gateway wrote its
    first request record."""
    done = node.cli("usage", "--by", "tag", "--json")
    if done.returncode != 0 and "no request records on this node yet" in done.stderr:
        return {}
    assert done.returncode == 0, done.stderr
    return {r["tag"]: r["requests"] for r in json.loads(done.stdout)}


def test_tags_reach_request_and_usage_by_tag(main_node: RunningNode) -> None:
    main_node.wait_healthy()
    before = tag_counts(main_node)
    with httpx.Client(base_url=main_node.url) as client:
        for i, tagged in enumerate(["team-a,exp-1", "team-a", "team-b"]):
            answered = client.post(
                "/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                headers={
                    "authorization": f"Bearer {main_node.key}",
                    "x-request-id": f"tagged-{i}",
                    "x-letsinfer-tags": tagged,
                },
            )
            assert answered.status_code == 200
        refused = client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            headers={
                "authorization": f"Bearer {main_node.key}",
                "x-letsinfer-tags": ",".join(f"t{i}" for i in range(9)),
            },
        )
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "X-Letsinfer-Tags"

    def added() -> dict[str, int]:
        now = tag_counts(main_node)
        return {tag: now.get(tag, 0) - before.get(tag, 0) for tag in ("team-a", "exp-1", "team-b")}

    deadline = time.monotonic() + 15
    while (tags := added())["team-b"] != 1:
        assert time.monotonic() < deadline, tags
        time.sleep(0.3)
    assert tags == {"team-a": 2, "exp-1": 1, "team-b": 1}
    [record] = _cli_json(main_node, "request", "tagged-0")
    assert record["tags"] == ["team-a", "exp-1"]
    shown = main_node.cli("request", "tagged-0")
    assert "team-a" in shown.stdout
