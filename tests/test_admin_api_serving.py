"""Serving work from a paired workstation through the admin API: `eval run`,
`model install`, typed at the main and at a workstation paired with it (the
in-process Desk of tests/admin_desk.py), with the same words, JSON and exit
codes; a role too small refused before anything is sent; bad input refused
with nothing changed; the work audited under the controller's name."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from letsinfer.evals.runner import Gateway
from letsinfer.release import runtime
from tests.admin_desk import Desk, audited, store_state

# -- eval run ----------------------------------------------------------------

ARITHMETIC = {  # the built-in arithmetic suite's questions, answered right
    "What is 17 + 25?": "42",
    "What is 100 - 37?": "63",
    "What is 12 * 12?": "144",
    "What is 7 divided by 2?": "3.5",
    "A box holds 6 eggs. How many eggs are in 9 boxes?": "54",
}


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The main's gateway as the eval runner reaches it (whoever asked for
    the run: the main's CLI or a controller): answering right, wrong, or
    not at all, as ``mode`` says; what it was asked is kept."""
    seen: dict[str, Any] = {"mode": "right", "asked": []}

    def answer(request: httpx.Request) -> httpx.Response:
        if seen["mode"] == "down":
            raise httpx.ConnectError("connection refused", request=request)
        asked = json.loads(request.content)["messages"][-1]["content"]
        seen["asked"].append((request.headers["authorization"], asked))
        said = ARITHMETIC.get(asked, "") if seen["mode"] == "right" else "I do not know"
        return httpx.Response(200, json={"choices": [{"message": {"content": said}}]})

    def made(settings: Any, secret: str, made_now: bool) -> Gateway:
        return Gateway("http://gw", secret, transport=httpx.MockTransport(answer))

    monkeypatch.setattr("letsinfer.evals.running.main_gateway", made)
    return seen


SUITE = "name: mine\ncases:\n  - {messages: [{role: user, content: q}], expect: {exact: a}}\n"


def _same_run(out: str, remote_run: str, local_run: str) -> str:
    """The output with the run's own id (and what carries it) made alike."""
    return out.replace(local_run, remote_run)


def _run_id(text: str) -> str:
    found = re.search(r"\(run ([0-9a-f]{12})\)", text)
    assert found, text
    return found.group(1)


def test_eval_run_from_a_workstation_runs_on_the_main_and_prints_what_it_prints(
    desk: Desk, gateway: dict[str, Any]
) -> None:
    """Passing and failing, text and --json: the main runs the suite through
    its gateway under its eval key; the workstation prints its words and
    exits with its code; each run kept and audited under who asked."""
    store = desk.main.store
    since = len(store.list_audit())
    for mode, code in (("right", 0), ("wrong", 1)):
        gateway["mode"] = mode
        remote = desk.at_ws("op", "eval", "run", "tiny", "--suite", "arithmetic")
        local = desk.at_main("eval", "run", "tiny", "--suite", "arithmetic")
        assert (remote.code, local.code) == (code, code), remote.err
        assert remote.out.startswith("eval arithmetic (5 cases) on tiny\n")
        ran, here = _run_id(remote.out), _run_id(local.out)
        assert ran != here
        assert (remote.out, remote.err) == (_same_run(local.out, ran, here), local.err)
    gateway["mode"] = "right"  # (and `eval MODEL` is `eval run MODEL` there too)
    assert "passed (run" in desk.at_ws("op", "eval", "tiny", "--suite", "arithmetic").out
    assert {key for key, _ in gateway["asked"]} == {gateway["asked"][0][0]}  # one eval key
    assert ("controller:op", "eval.key.create", "ok") in audited(store, since)
    assert [a for a in audited(store, since) if a[1] == "eval.run"] == [
        ("controller:op", "eval.run", "ok"),
        ("cli", "eval.run", "ok"),
        ("controller:op", "eval.run", "ok"),
        ("cli", "eval.run", "ok"),
        ("controller:op", "eval.run", "ok"),
    ]
    listed = json.loads(desk.at_main("eval", "runs", "--json").out)
    assert [r["passed"] for r in listed] == [True, False, False, True, True]

    remote = desk.at_ws("op", "eval", "run", "tiny", "--suite", "arithmetic", "--json")
    local = desk.at_main("eval", "run", "tiny", "--suite", "arithmetic", "--json")
    assert remote.code == local.code == 0, remote.err
    shown, here = json.loads(remote.out), json.loads(local.out)
    for run in (shown, here):  # (what differs between two runs of the same suite)
        for case in run["cases"]:
            case.pop("duration_ms")
            case["request_id"] = case["request_id"].replace(run["run"], "RUN")
        run.pop("run"), run.pop("started")
    assert shown == here and (remote.err, local.err) == ("", "")
    assert list(json.loads(remote.out)) == list(json.loads(local.out))  # the same keys, in order
    assert shown["score"] == 1 and [c["score"] for c in shown["cases"]] == [1.0] * 5


def test_an_eval_run_that_cannot_reach_the_gateway_says_so_alike(
    desk: Desk, gateway: dict[str, Any]
) -> None:
    gateway["mode"] = "down"
    remote = desk.at_ws("op", "eval", "run", "tiny", "--suite", "arithmetic")
    local = desk.at_main("eval", "run", "tiny", "--suite", "arithmetic")
    assert remote.code == local.code == 1
    assert (remote.out, remote.err) == (local.out, local.err)
    assert "cannot reach the gateway" in remote.err
    assert desk.main.store.list_eval_runs(None, 10) == []


def test_a_viewer_may_not_run_an_eval_and_only_the_notice_is_sent(
    desk: Desk, gateway: dict[str, Any]
) -> None:
    store = desk.main.store
    before, since = store_state(store), len(store.list_audit())
    refused = desk.at_ws("watcher", "eval", "run", "tiny", "--suite", "arithmetic")
    assert refused.code == 1
    assert "needs the operator role; this controller (watcher) is viewer" in refused.err
    assert desk.sent == [("watcher", "POST", "/v1/ops/denied")]
    assert audited(store, since) == [("controller:watcher", "cli:eval run", "denied")]
    assert store_state(store) == before and gateway["asked"] == []
    with desk.main.client("watcher") as viewer:
        raw = viewer.post("/v1/ops/evals", json={"model": "tiny", "suite": "arithmetic"})
    assert raw.status_code == 403
    assert store.list_eval_runs(None, 10) == [] and gateway["asked"] == []


def test_an_eval_run_of_what_is_not_there_is_refused_alike_and_runs_nothing(
    desk: Desk, gateway: dict[str, Any], tmp_path: Any
) -> None:
    """No such model or group: the main's words and exit code (2, as a bad
    option) at both; a suite file from a workstation is refused there, and
    the main itself refuses any suite but a built-in one, opening no file."""
    store = desk.main.store
    before = store_state(store)
    for argv in (
        ["nothing", "--suite", "arithmetic"],
        ["tiny", "--suite", "arithmetic", "--group", "pg-nope"],
    ):
        remote = desk.at_ws("op", "eval", "run", *argv)
        local = desk.at_main("eval", "run", *argv)
        assert remote.code == local.code == 2, (argv, remote.err)
        assert (remote.out, remote.err) == (local.out, local.err), argv
    missing = desk.at_ws("op", "eval", "run", "nothing", "--suite", "json-format")
    assert "Invalid value for 'MODEL': no model 'nothing'" in missing.err

    suite = tmp_path / "mine.yaml"
    suite.write_text(SUITE)
    sent = len(desk.sent)
    for given in (str(suite), "no-such-suite"):
        mine = desk.at_ws("op", "eval", "run", "tiny", "--suite", given)
        assert mine.code == 2 and "from a controller, an eval's suite is a built-in one" in mine.err
        assert "Nothing was sent." in mine.err and len(desk.sent) == sent
    with desk.main.client("op") as op:
        for body in (
            {"model": "tiny", "suite": str(suite)},
            {"model": "tiny", "suite": "/etc/passwd"},
        ):
            raw = op.post("/v1/ops/evals", json=body)
            assert raw.status_code == 400 and "built-in one" in raw.text, body
        for body in (
            {"model": "", "suite": "arithmetic"},
            {"model": "tiny"},
            {"model": "tiny", "suite": "arithmetic", "text": "cases: []"},
        ):
            assert op.post("/v1/ops/evals", json=body).status_code == 422, body
        raw = op.post("/v1/ops/evals", json={"model": "nothing", "suite": "arithmetic"})
        assert raw.status_code == 404 and "no model 'nothing'" in raw.text
    assert gateway["asked"] == []
    assert store.list_eval_runs(None, 10) == [] and store_state(store) == before


# -- model install -------------------------------------------------------------

GROUP = re.compile(r"pg-[0-9a-f]{12}")


def _groups_alike(text: str) -> str:
    return GROUP.sub("pg-ID", text)


def _added(desk: Desk, tiny_gguf: Path, *names: str) -> None:
    """Models registered on the main, not placed yet."""
    for name in names:
        added = desk.at_main("model", "add", name, "--gguf", str(tiny_gguf), "--no-serve")
        assert added.code == 0, added.err


def _groups_of(store: Any, model: str) -> list[str]:
    return sorted(g.id for g in store.list_placement_groups(service=model))


def test_model_install_from_a_workstation_places_it_as_on_the_main(
    desk: Desk, tiny_gguf: Path
) -> None:
    """Two models alike but for their names: one installed from the
    workstation, the other on the main; the same words and exit code, the
    group made on the main, audited under the controller. With no --node, a
    workstation is asked nothing: without --yes it is told what would happen
    and refused, changing nothing; with --yes it is done as on the main."""
    store = desk.main.store
    _added(desk, tiny_gguf, "from-ws", "from-main", "all-ws", "all-main")
    since = len(store.list_audit())
    remote = desk.at_ws("op", "model", "install", "from-ws", "--node", "main")
    assert remote.code == 0, remote.err
    local = desk.at_main("model", "install", "from-main", "--node", "main")
    assert local.code == 0, local.err
    assert _groups_alike(remote.out).replace("from-ws", "from-main") == _groups_alike(local.out)
    assert remote.err == local.err == ""
    assert "  install main: " in remote.out and "1 placement group(s) created: pg-" in remote.out
    [made] = _groups_of(store, "from-ws")
    assert made in remote.out and len(_groups_of(store, "from-main")) == 1
    assert ("controller:op", "model.install", "ok") in audited(store, since)
    assert [a for a in audited(store, since) if a[1] == "model.install"] == [
        ("controller:op", "model.install", "ok"),
        ("cli", "model.install", "ok"),
    ]

    before = store_state(store)
    asked = desk.at_ws("op", "model", "install", "all-ws")
    assert asked.code == 1
    said = " ".join(asked.err.split())
    assert "Replicate all-ws on every active node (main)?" in said
    assert "pass --yes" in said and "Nothing changed." in said
    assert store_state(store) == before

    remote = desk.at_ws("op", "model", "install", "all-ws", "--yes", "--min", "1")
    local = desk.at_main("model", "install", "all-main", "--yes", "--min", "1")
    assert remote.code == local.code == 0, remote.err
    assert _groups_alike(remote.out).replace("all-ws", "all-main") == _groups_alike(local.out)
    assert "model all-ws: " in remote.out  # its scaling policy, set after it was placed
    assert len(_groups_of(store, "all-ws")) == len(_groups_of(store, "all-main")) == 1


def test_model_install_replacing_needs_its_answer_in_the_request(
    running_desk: Desk,
) -> None:
    """A model that already runs on the node: refused (audited) without
    --replace-existing, as on the main with --yes (which is not that answer); with it, the group is
    replaced through the main's loop alike from the workstation and on the
    main (no agent here: the new group never gets ready, the old one stays)."""
    desk, store = running_desk, running_desk.main.store
    [old] = _groups_of(store, "tiny")
    before, since = store_state(store), len(store.list_audit())
    for extra in ([], ["--yes"]):  # (nothing asks a workstation: as --yes on the main)
        remote = desk.at_ws("op", "model", "install", "tiny", "--node", "main", *extra)
        local = desk.at_main("model", "install", "tiny", "--node", "main", "--yes")
        assert remote.code == local.code == 1, extra
        assert (remote.out, remote.err) == (local.out, local.err), extra
        assert f"(replaces {old})" in remote.out
        assert "pass --replace-existing to replace it. Nothing changed." in remote.err
    assert store_state(store) == before
    assert [a for a in audited(store, since) if a[1] == "model.install"] == [
        ("controller:op", "model.install", "denied"),
        ("cli", "model.install", "denied"),
    ] * 2

    assert desk.main.serving is not None  # (its gateway trusts the main's own release key)
    desk.main.serving.trusted = [runtime.ensure_cluster_key(desk.main.home)]
    since = len(store.list_audit())
    argv = ("model", "install", "tiny", "--node", "main", "--replace-existing")
    remote = desk.at_ws("op", *argv)
    local = desk.at_main(*argv)
    assert (remote.code, remote.err) == (local.code, local.err)
    assert _groups_alike(remote.out) == _groups_alike(local.out)
    assert f"  {old} on main: restored " in remote.out and remote.code == 1
    assert "install of tiny stopped" in remote.err
    assert [a for a in audited(store, since) if a[1] == "model.install"] == [
        ("controller:op", "model.install", "failed"),
        ("local:root", "model.install", "failed"),  # (the admin socket's administrator)
    ]
    assert _groups_of(store, "tiny") == [old]


def test_a_viewer_may_not_install_a_model_and_only_the_notice_is_sent(
    desk: Desk, tiny_gguf: Path
) -> None:
    store = desk.main.store
    _added(desk, tiny_gguf, "other")
    before, since = store_state(store), len(store.list_audit())
    refused = desk.at_ws("watcher", "model", "install", "other", "--node", "main", "--yes")
    assert refused.code == 1
    assert "needs the operator role; this controller (watcher) is viewer" in refused.err
    assert desk.sent == [("watcher", "POST", "/v1/ops/denied")]
    assert audited(store, since) == [("controller:watcher", "cli:model install", "denied")]
    with desk.main.client("watcher") as viewer:
        assert viewer.post("/v1/ops/models/other/install", json={"yes": True}).status_code == 403
    assert store_state(store) == before and _groups_of(store, "other") == []


def test_a_model_install_of_what_is_not_there_is_refused_alike_and_changes_nothing(
    desk: Desk, tiny_gguf: Path
) -> None:
    store = desk.main.store
    _added(desk, tiny_gguf, "other")
    with store.transaction():
        store.add_adapter("tiny-lora", "tiny", "ab" * 32, 10, None)
    before = store_state(store)
    for argv in (
        ["nothing", "--node", "main"],
        ["tiny-lora", "--node", "main"],
        ["other", "--node", "nowhere"],
        ["other", "--node", "main", "--gpu", "GPU-none", "--target", "cuda"],
        ["other", "--node", "main", "--parallel"],
    ):
        remote = desk.at_ws("op", "model", "install", *argv)
        local = desk.at_main("model", "install", *argv)
        assert remote.code == local.code == 1, (argv, remote.err)
        assert (remote.out, remote.err) == (local.out, local.err), argv
    nothing = desk.at_ws("op", "model", "install", "nothing", "--node", "main").err
    assert "no model 'nothing'" in nothing
    assert "takes its base model" in desk.at_ws("op", "model", "install", "tiny-lora").err
    assert store_state(store) == before
    with desk.main.client("op") as op:
        for body in (
            {"gpus": 0},
            {"target": "tpu"},
            {"nodes": [""]},
            {"yes": True, "sha256": "00"},
        ):
            assert op.post("/v1/ops/models/other/install", json=body).status_code == 422, body
        raw = op.post("/v1/ops/models/nothing/install", json={"nodes": ["main"]})
        assert raw.status_code == 404 and "no model 'nothing'" in raw.text
        raw = op.post("/v1/ops/models/other/install", json={})
        assert raw.status_code == 409 and "pass --yes" in raw.text
    assert store_state(store) == before and _groups_of(store, "other") == []


# -- top -------------------------------------------------------------------------

METRICS = """\
# TYPE letsinfer_model_ready_groups gauge
letsinfer_model_ready_groups{model="tiny"} 1.0
# TYPE letsinfer_model_groups gauge
letsinfer_model_groups{model="tiny"} 1.0
# TYPE letsinfer_gateway_queue_depth gauge
letsinfer_gateway_queue_depth{model="tiny"} 2.0
# TYPE letsinfer_gateway_requests_total counter
letsinfer_gateway_requests_total{model="tiny",status="200"} 7.0
# TYPE letsinfer_group_state gauge
letsinfer_group_state{desired="running",model="tiny",node="main",pg="pg-1",state="ready"} 1.0
# TYPE letsinfer_group_free_slots gauge
letsinfer_group_free_slots{pg="pg-1"} 3.0
# TYPE letsinfer_node_info gauge
letsinfer_node_info{node="main",role="main"} 1.0
letsinfer_node_info{node="c-remote",role="child"} 1.0
"""


@pytest.fixture
def metrics(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The main's metrics endpoint, as whoever reads it reaches it: the URL
    each read asked for is kept; "down" in the list: it does not answer."""
    asked: list[str] = []

    def read(url: str, timeout_s: float = 5.0) -> str:
        if "down" in asked:
            raise httpx.ConnectError("connection refused")
        asked.append(url)
        return METRICS

    monkeypatch.setattr("letsinfer.telemetry.top.read_metrics", read)
    return asked


def test_top_once_from_a_workstation_shows_the_main_s_figures(
    desk: Desk, metrics: list[str]
) -> None:
    """The main's metrics endpoint (by the main's settings, not the
    workstation's), read by the main for a viewer's workstation: the same
    view as `top --once` on the main, changing nothing."""
    desk.main.home.config_file.write_text("[gateway]\nmetrics_port = 9581\n")
    store = desk.main.store
    before, since = store_state(store), len(store.list_audit())
    remote = desk.at_ws("watcher", "top", "--once", "--interval", "0.1")
    assert remote.code == 0, remote.err
    assert metrics == ["http://127.0.0.1:9581/metrics"] * 2
    local = desk.at_main("top", "--once", "--interval", "0.1")
    assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err)
    assert "c-remote" in remote.out and "pg-1" in remote.out
    assert desk.sent == [("watcher", "GET", "/v1/ops/metrics")] * 2
    assert store_state(store) == before and audited(store, since) == []


def test_top_from_a_workstation_says_why_the_main_has_no_figures_as_the_main_does(
    desk: Desk, metrics: list[str]
) -> None:
    desk.main.home.config_file.write_text("[gateway]\nmetrics_port = 0\n")
    remote = desk.at_ws("watcher", "top", "--once", "--interval", "0.1")
    local = desk.at_main("top", "--once", "--interval", "0.1")
    assert remote.code == local.code == 1
    assert (remote.out, remote.err) == (local.out, local.err)
    assert "metrics are off ([gateway] metrics_port = 0)" in remote.err

    desk.main.home.config_file.write_text("[gateway]\nmetrics_port = 9581\n")
    metrics.append("down")
    remote = desk.at_ws("watcher", "top", "--once", "--interval", "0.1")
    local = desk.at_main("top", "--once", "--interval", "0.1")
    assert remote.code == local.code == 1
    assert (remote.out, remote.err) == (local.out, local.err)
    assert "cannot read the metrics at http://127.0.0.1:9581/metrics" in remote.err
    with desk.main.client(None) as anyone:  # no controller's certificate: nothing read
        assert anyone.get("/v1/ops/metrics").status_code == 403
    with desk.main.client("watcher") as viewer:
        assert viewer.get("/v1/ops/metrics").status_code == 409


# -- release add -------------------------------------------------------------------


def _binary(path: Path, marker: Path) -> Path:
    """A llama-server stand-in: answers --version, and leaves ``marker`` when
    it is run (so a test sees whether the main ran it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ntouch {marker}\necho 'version: 1 (stand-in)'\n")
    path.chmod(0o755)
    return path


def _release_ids(store: Any) -> list[str]:
    from letsinfer.authority.views import release_rows

    return sorted(r["id"] for r in release_rows(store))


def test_release_add_from_a_workstation_of_a_binary_on_the_main(desk: Desk, tmp_path: Path) -> None:
    """A binary the main holds where controllers may add from: released from
    an administrator's workstation as on the main (the same release, said
    alike), audited under the controller."""
    bins = tmp_path / "bins"
    binary = _binary(bins / "llama-server", tmp_path / "ran")
    desk.main.home.config_file.write_text(f"[control]\nadd_from = [{json.dumps(str(bins))}]\n")
    store = desk.main.store
    since = len(store.list_audit())
    argv = ("release", "add", "--llama-server", str(binary), "--target", "cpu")
    remote = desk.at_ws("fuzz", *argv)
    assert remote.code == 0, remote.err
    assert remote.out.startswith("release added: llama.cpp-llama-server-")
    assert f"  binary {binary}  sha256 " in remote.out and "version: 1 (stand-in)" in remote.out
    assert audited(store, since) == [("controller:fuzz", "release.add", "ok")]
    [made] = [r for r in _release_ids(store) if r in remote.out]
    local = desk.at_main(*argv)  # the same binary, as it is: the same release
    assert local.code == 0, local.err
    assert remote.out.replace("release added", "release exists") == local.out
    again = desk.at_ws("fuzz", *argv)
    assert (again.code, again.out, again.err) == (local.code, local.out, local.err)
    assert [r for r in _release_ids(store) if r in remote.out] == [made]
    assert len(audited(store, since)) == 1  # (a release recorded before changes nothing)


def test_an_operator_may_not_add_a_release_and_only_the_notice_is_sent(
    desk: Desk, tmp_path: Path
) -> None:
    bins = tmp_path / "bins"
    binary = _binary(bins / "llama-server", tmp_path / "ran")
    desk.main.home.config_file.write_text(f"[control]\nadd_from = [{json.dumps(str(bins))}]\n")
    store = desk.main.store
    releases, since = _release_ids(store), len(store.list_audit())
    refused = desk.at_ws("op", "release", "add", "--llama-server", str(binary))
    assert refused.code == 1
    assert "needs the administrator role; this controller (op) is operator" in refused.err
    assert desk.sent == [("op", "POST", "/v1/ops/denied")]
    assert audited(store, since) == [("controller:op", "cli:release add", "denied")]
    with desk.main.client("op") as op:
        assert op.post("/v1/ops/releases", json={"binary": str(binary)}).status_code == 403
    assert _release_ids(store) == releases and not (tmp_path / "ran").exists()


def test_a_controller_cannot_make_the_main_run_a_binary_outside_where_it_may_add_from(
    desk: Desk, tmp_path: Path
) -> None:
    """A binary elsewhere on the main (or a link from inside to it, or a path
    climbing out) is refused as a missing file is, and never run; a file
    inside that is no binary is refused with the main's own words; bad
    bodies are 422. Nothing is recorded."""
    bins = tmp_path / "bins"
    bins.mkdir()
    desk.main.home.config_file.write_text(f"[control]\nadd_from = [{json.dumps(str(bins))}]\n")
    outside = _binary(tmp_path / "elsewhere" / "llama-server", tmp_path / "ran")
    (bins / "link").symlink_to(outside)
    (bins / "notes.txt").write_text("not a binary\n")
    store = desk.main.store
    releases, before, since = _release_ids(store), store_state(store), len(store.list_audit())
    answers = set()
    for path in (
        str(outside),
        str(bins / "link"),
        f"{bins}/../elsewhere/llama-server",
        str(bins / "missing"),
        "server-on-path",  # (a name the main would look up on its PATH)
    ):
        refused = desk.at_ws("fuzz", "release", "add", "--llama-server", path)
        assert refused.code == 1, path
        answers.add(" ".join(refused.err.replace(path, "PATH").split()))
    assert len(answers) == 1, answers  # one answer, whatever is (or is not) there
    [said] = answers
    assert f"under one of {desk.main.home.model_store}" in said and str(bins) in said
    assert "Nothing changed." in said and "model pull" not in said
    assert not (tmp_path / "ran").exists()  # the main never ran it

    argv = ("release", "add", "--llama-server", str(bins / "notes.txt"))
    remote, local = desk.at_ws("fuzz", *argv), desk.at_main(*argv)
    assert remote.code == local.code == 1
    assert (remote.out, remote.err) == (local.out, local.err)
    assert "not executable. Nothing changed." in remote.err
    with desk.main.client("fuzz") as admin:
        for body in (
            {"binary": str(outside), "target": "tpu"},
            {"binary": ""},
            {"binary": str(outside), "sha256": "00"},
        ):
            assert admin.post("/v1/ops/releases", json=body).status_code == 422, body
    assert _release_ids(store) == releases and store_state(store) == before
    assert audited(store, since) == []
