"""The admin API as a controller meets it: its OpenAPI document (committed,
served, valid, complete), its roles, and a fuzz from the document against a
real control-plane app with a real store in a temporary home.

In-process: requests go through the real control app and its PeerGate, each
carrying a real controller certificate issued by the home's cluster CA in
the request scope exactly where the mutual-TLS protocol puts it (only the
TLS handshake itself is skipped; tests/test_admin_api_lab.py goes through
real mutual TLS)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from letsinfer.authority import controllers
from letsinfer.control.ops.openapi import DOCUMENT, admin_openapi, rendered
from letsinfer.home import Home
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.store import AuthorityStore
from tests.admin_desk import (
    Desk,
    Main,
    Typed,
    audited,
    served,
    set_desired,
    store_state,
)
from tests.nodes import letsinfer

ROOT = Path(__file__).resolve().parent.parent
HOOK = "whsec_" + "A" * 32  # a webhook secret of the right shape


def test_the_committed_document_is_the_one_the_routes_make() -> None:
    committed = DOCUMENT.read_text() if DOCUMENT.exists() else ""
    assert committed == rendered(), (
        f"{DOCUMENT.relative_to(ROOT)} is stale (or missing): run `./dev openapi` and commit it"
    )


def test_the_document_is_valid_openapi_3_1() -> None:
    from openapi_spec_validator import validate

    document = json.loads(DOCUMENT.read_text())
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_every_admin_route_of_the_control_plane_is_in_the_document_and_nothing_else(
    main: Main,
) -> None:
    fastapi_app = main.app.app.app  # PeerGate -> the reports' route -> the FastAPI app
    served = {
        (path, method)
        for path, ops in fastapi_app.openapi()["paths"].items()
        if path.startswith("/v1/ops/")
        for method in ops
    }
    documented = {
        (path, method) for path, ops in admin_openapi()["paths"].items() for method in ops
    }
    assert served, "the control plane serves admin routes"
    assert served - documented == set(), "admin routes missing from the OpenAPI document"
    assert {p for p, _ in documented} <= {p for p, _ in served} | {"/v1/ops/openapi.json"}
    # The gateway's OpenAI surface and the nodes' and pairing paths are not in it.
    assert all(p.startswith("/v1/ops/") for p, _ in documented)
    for path, method in documented:
        operation = admin_openapi()["paths"][path][method]
        assert operation["x-letsinfer-role"] in controllers.ROLE_RANK, (path, method)


def test_controllers_read_the_document_at_its_path_and_no_one_else(main: Main) -> None:
    with main.client("watcher") as viewer:
        served = viewer.get("/v1/ops/openapi.json")
    assert served.status_code == 200 and served.json() == admin_openapi()
    with main.client(None) as anyone:
        refused = anyone.get("/v1/ops/openapi.json")
    assert refused.status_code == 403


def test_a_viewer_s_raw_request_for_operator_work_is_refused_and_audited(
    main: Main,
) -> None:
    before = len(main.store.list_audit())
    with main.client("watcher") as viewer:
        answer = viewer.post("/v1/ops/models/tiny/upgrade", json={"release": "r1"})
    assert answer.status_code == 403
    assert "needs the operator role" in answer.json()["error"]["message"]
    [record] = main.store.list_audit()[before:]
    assert (record.actor, record.outcome) == ("controller:watcher", "denied")
    assert record.action == "/v1/ops/models/tiny/upgrade"


def test_a_denied_attempt_notice_is_audited_under_the_controller(main: Main) -> None:
    before = len(main.store.list_audit())
    with main.client("watcher") as viewer:
        answer = viewer.post(
            "/v1/ops/denied", json={"command": "auth key create", "needs": "administrator"}
        )
        bad = viewer.post("/v1/ops/denied", json={"command": "x; rm", "needs": "root"})
    assert answer.status_code == 200 and bad.status_code == 422
    [record] = main.store.list_audit()[before:]
    assert (record.actor, record.action, record.outcome) == (
        "controller:watcher",
        "cli:auth key create",
        "denied",
    )


class Unaudited:
    """Each request's effect on the store and the audit chain, checked."""

    def __init__(self, store: AuthorityStore) -> None:
        self.store = store
        self.seen: dict[str, int] = {}

    def check(self, method: str, path: str, send: Any) -> Any:
        audit_before = len(self.store.list_audit())
        state_before = store_state(self.store)
        response = send()
        what = f"{method} {path} -> {response.status_code}"
        assert response.status_code < 500, (what, response.text[:500])
        ok = 200 <= response.status_code < 300
        self.seen[f"{method.upper()} {'2xx' if ok else 'refused'}"] = (
            self.seen.get(f"{method.upper()} {'2xx' if ok else 'refused'}", 0) + 1
        )
        audited = len(self.store.list_audit()) > audit_before
        if method.upper() == "POST" and ok:
            assert audited, f"{what}: a change answered 2xx without an audit record"
        if store_state(self.store) != state_before:
            assert audited, f"{what}: the store changed without an audit record"
        return response


def test_fuzzed_from_the_document_no_5xx_and_no_unaudited_change(main: Main) -> None:
    """A few hundred requests the document allows (and some it does not), as
    the administrator: none answers 5xx, every 2xx to a mutating route adds an
    audit record, and no request changes the store without one. Then the
    operations with names that exist (random names seldom do), the same way."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_asgi("/v1/ops/openapi.json", main.as_controller("fuzz"))
    # Not fuzzed: `cluster stop|start|restart` wait on engines (none run here)
    # and would leave this module's one main stopped for the tests after;
    # test_cluster_stop_and_start_from_a_workstation covers them.
    schema = schema.exclude(path_regex=r"^/v1/ops/cluster/(stop|start|restart)$")
    cases = st.one_of(
        schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
        schema.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )
    watch = Unaudited(main.store)

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=cases)
    def one(case: Any) -> None:
        watch.check(case.method, case.formatted_path, case.call)

    one()
    assert watch.seen.get("POST refused") and watch.seen.get("GET 2xx"), watch.seen

    [group] = main.store.list_placement_groups()
    named = [
        ("/v1/ops/keys", {"name": "fz", "models": ["tiny"], "rpm": 5, "band": "batch"}),
        ("/v1/ops/keys", {"name": "fz", "concurrency": 0}),
        ("/v1/ops/keys/fz/limits", {"tpm": 100, "budget_tokens": 9, "budget_period": "day"}),
        ("/v1/ops/keys/fz/limits", {"band": None}),
        ("/v1/ops/keys/fz/revoke", None),
        ("/v1/ops/keys/fz/revoke", None),
        ("/v1/ops/models/tiny/stop", None),
        ("/v1/ops/models/tiny/start", None),
        ("/v1/ops/models/tiny/resume", None),
        ("/v1/ops/models/tiny/scale", {"min_groups": 0, "max_groups": 2}),
        ("/v1/ops/models/tiny/scale", {"min_groups": 5, "max_groups": 2}),
        ("/v1/ops/models/tiny/fallback", {"fallback": "tiny"}),
        ("/v1/ops/models/tiny/fallback", {"fallback": None}),
        ("/v1/ops/models/tiny/upgrade", {"release": "no-such-release"}),
        ("/v1/ops/models/tiny/rollback", {"to": group.id}),
        ("/v1/ops/models/tiny/rollback-weights", {"to": "deadbeef"}),
        ("/v1/ops/models/tiny/update-from-origin", {"canary": 10}),  # refused: no origin
        ("/v1/ops/models/tiny/gate", {"suite": "arithmetic", "min_score": 0.5}),
        ("/v1/ops/models/tiny/gate", {"suite": str(main.home.database), "min_score": 0.5}),
        ("/v1/ops/models/tiny/gate/clear", None),
        ("/v1/ops/models/tiny/gate/clear", None),
        ("/v1/ops/nodes/main/pause", None),
        ("/v1/ops/models/tiny/scale", {"max_groups": 3}),
        ("/v1/ops/nodes/main/resume", None),
        ("/v1/ops/nodes/main/remove", None),
        ("/v1/ops/webhooks/remove", {"url": "https://none.example/hook"}),
        ("/v1/ops/models/pull", {"repo": "org/none", "no_serve": True}),
        ("/v1/ops/models/add", {"name": "fz", "gguf": "/nowhere/fz.gguf"}),
        ("/v1/ops/models/add", {"name": "fz", "gguf": str(main.home.config_file)}),
        ("/v1/ops/models/nothing/remove", {"stop": True}),
        ("/v1/ops/models/tiny/remove", {"stop": False}),  # refused: its group should run
        ("/v1/ops/mirror/remove", {"digest": "00"}),  # refused: no such artifact
        ("/v1/ops/models/tiny/adapters", {"name": "fz-lora", "gguf": "/etc/shadow"}),
        ("/v1/ops/adapters/fz-lora/remove", None),
        ("/v1/ops/webhooks", {"url": "http://10.0.0.1/hook", "events": ["*"], "secret": HOOK}),
        ("/v1/ops/webhooks", {"url": "https://192.0.2.1/hook", "events": ["*"], "secret": "x"}),
        ("/v1/ops/webhooks", {"url": "https://8.8.8.8/hook", "events": ["*"], "secret": HOOK}),
        ("/v1/ops/webhooks/test", {"url": "https://none.example/hook"}),
        ("/v1/ops/webhooks/remove", {"url": "https://8.8.8.8/hook"}),
    ]
    with main.client("fuzz") as admin:
        for path, body in named:
            watch.check("POST", path, lambda p=path, b=body: admin.post(p, json=b))
    assert watch.seen.get("POST 2xx", 0) >= 8, watch.seen


def test_a_selected_controller_refuses_here_what_it_cannot_send(tmp_path: Path) -> None:
    """A workstation paired as a viewer: operator work and commands that never
    run from a controller are refused before anything goes to the main (here no
    main listens at all: a command that tried would say it cannot connect)."""
    ws = tmp_path / "ws"
    pairing = ws / "etc/controller/mains/look"
    pairing.mkdir(parents=True)
    (pairing / "controller.json").write_text(
        json.dumps(
            {"main": "127.0.0.1:9", "main_id": "n-x", "controller_id": "c", "role": "viewer"}
        )
    )
    listed = letsinfer(ws, "controller", "list", "--json")
    assert json.loads(listed.stdout) == [
        {
            "name": "look",
            "main": "127.0.0.1:9",
            "role": "viewer",
            "main_id": "n-x",
            "selected": False,
        }
    ]
    upgrade = letsinfer(ws, "--controller", "look", "model", "upgrade", "tiny", "--release", "r")
    assert upgrade.returncode == 1, upgrade.stderr
    assert "needs the operator role; this controller (look) is viewer" in upgrade.stderr
    assert "`model upgrade` was not sent" in upgrade.stderr
    assert "could not be told" in upgrade.stderr  # (no main here to audit it)

    assert letsinfer(ws, "controller", "use", "look").returncode == 0
    assert json.loads(letsinfer(ws, "controller", "list", "--json").stdout)[0]["selected"]
    for argv in (["user", "list"],):  # (every other command on the main has an operation)
        refused = letsinfer(ws, *argv)
        assert refused.returncode == 3, refused.stderr
        said = " ".join(refused.stderr.split())
        assert "runs only from a shell on the main, never from a controller" in said
        assert "Nothing was sent" in said
    unknown = letsinfer(ws, "usage", env={"LETSINFER_CONTROLLER": "nobody"})
    assert unknown.returncode == 1 and "no main paired as 'nobody'" in unknown.stderr

    assert letsinfer(ws, "controller", "use", "--clear").returncode == 0
    here = letsinfer(ws, "usage")  # nothing selected: this machine's, and it is no node
    assert here.returncode == 3 and "not a letsinfer node" in here.stderr


# -- One CLI, local or remote: each operation typed at the main and at a paired
# workstation (in-process: the workstation's requests go through the main's
# control app with its controller's certificate, as Main.client sends them).


@pytest.mark.parametrize(
    ("argv", "before", "action"),
    [
        (["model", "stop", "tiny"], "running", "model.stop"),
        (["model", "start", "tiny"], "stopped", "model.start"),
        (["model", "resume", "tiny"], "stopped", "model.resume"),
    ],
)
def test_model_stop_start_resume_from_a_workstation_print_what_the_main_prints(
    desk: Desk, monkeypatch: pytest.MonkeyPatch, argv: list[str], before: str, action: str
) -> None:
    monkeypatch.setattr("letsinfer.cli.model_state.STOP_WAIT_S", 0.5)  # (no agent stops it)
    store = desk.main.store
    set_desired(store, before)
    since = len(store.list_audit())
    remote = desk.at_ws("op", *argv)
    assert remote.code == 0, remote.err
    assert ("controller:op", action, "ok") in audited(store, since)
    after = [(g.id, g.desired) for g in store.list_placement_groups()]
    assert {d for _, d in after} == {"stopped" if before == "running" else "running"}
    set_desired(store, before)
    local = desk.at_main(*argv)
    assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err)
    assert remote.out.startswith("model tiny: ") and "on main: " in remote.out


def test_model_start_wait_from_a_workstation_waits_by_the_main_s_setting(
    desk: Desk,
) -> None:
    """The main's [lifecycle] start_timeout_s, not the workstation's: here 1s
    (no agent starts the group), said in the refusal as on the main."""
    (desk.main.home.config_file).write_text("[lifecycle]\nstart_timeout_s = 1\n")
    set_desired(desk.main.store, "stopped")
    remote = desk.at_ws("op", "model", "start", "tiny", "--wait")
    set_desired(desk.main.store, "stopped")
    local = desk.at_main("model", "start", "tiny", "--wait")
    assert remote.code == local.code == 1
    assert "model tiny is starting after 1s" in remote.err
    assert (remote.out, remote.err) == (local.out, local.err)


def test_a_viewer_may_not_stop_a_model_and_nothing_is_sent_but_the_notice(desk: Desk) -> None:
    store = desk.main.store
    before_state, since = store_state(store), len(store.list_audit())
    for verb in ("stop", "start", "resume"):
        refused = desk.at_ws("watcher", "model", verb, "tiny")
        assert refused.code == 1
        assert "needs the operator role; this controller (watcher) is viewer" in refused.err
    assert desk.sent == [("watcher", "POST", "/v1/ops/denied")] * 3  # the notices alone
    assert store_state(store) == before_state
    assert audited(store, since) == [
        ("controller:watcher", f"cli:model {v}", "denied") for v in ("stop", "start", "resume")
    ]


def test_a_model_stop_of_no_model_or_an_adapter_is_refused_alike_and_changes_nothing(
    desk: Desk,
) -> None:
    store = desk.main.store
    [tiny] = store.list_services()
    with store.transaction():
        store.add_adapter("tiny-lora", "tiny", "ab" * 32, 10, None)
    before = store_state(store)
    for verb in ("stop", "start", "resume"):
        for name in ("nothing", "tiny-lora"):
            remote = desk.at_ws("op", "model", verb, name)
            local = desk.at_main("model", verb, name)
            assert remote.code == local.code == 1, (verb, name)
            assert remote.err == local.err, (verb, name)
    assert "is a LoRA adapter of model 'tiny'" in desk.at_ws("op", "model", "stop", "tiny-lora").err
    assert store_state(store) == before
    with desk.main.client("op") as op:
        raw = op.post("/v1/ops/models/tiny-lora/stop")
    assert raw.status_code == 404 and "model stop` takes its base model" in raw.text
    assert tiny.name == "tiny"


@pytest.mark.parametrize("extra", [["--json"], []])
def test_cluster_status_from_a_workstation_is_the_main_s(desk: Desk, extra: list[str]) -> None:
    desk.main.store.add_node("c-a", "c-a", "child", "10.0.0.2:8444", "fp-a")
    remote = desk.at_ws("watcher", "cluster", "status", *extra)
    assert remote.code == 0, remote.err
    assert (remote.out, remote.err) == (desk.at_main("cluster", "status", *extra).out, "")
    assert "c-a" in remote.out and "main" in remote.out


@pytest.mark.parametrize("extra", [["--json"], []])
def test_node_remove_from_a_workstation_says_what_the_main_says(
    desk: Desk, extra: list[str]
) -> None:
    """Two children alike but for their names: one removed from the
    workstation, the other on the main; the same words, audited under the
    controller; a second removal of either refused alike, changing nothing."""
    store = desk.main.store
    for name in ("c-a", "c-b"):
        store.add_node(name, name, "child", None, f"fp-{name}")
    since = len(store.list_audit())
    remote = desk.at_ws("fuzz", "node", "remove", "c-a", *extra)
    assert remote.code == 0, remote.err
    assert ("controller:fuzz", "node.remove", "ok") in audited(store, since)
    local = desk.at_main("node", "remove", "c-b", *extra)
    assert remote.out.replace("c-a", "c-b") == local.out and remote.err == local.err == ""
    assert {n.name for n in store.list_nodes()} == {"main"}
    assert {n.name for n in store.list_nodes(include_removed=True)} == {"main", "c-a", "c-b"}

    before = store_state(store)
    for name in ("c-b", "nothing", "main"):
        again = desk.at_ws("fuzz", "node", "remove", name)
        here = desk.at_main("node", "remove", name)
        assert again.code == here.code == 1, name
        assert again.err == here.err and "Nothing changed." in here.err, name
    assert store_state(store) == before


def test_an_operator_may_not_remove_a_node_and_only_the_notice_is_sent(desk: Desk) -> None:
    store = desk.main.store
    store.add_node("c-a", "c-a", "child", None, "fp-a")
    before, since = store_state(store), len(store.list_audit())
    refused = desk.at_ws("op", "node", "remove", "c-a")
    assert refused.code == 1
    assert "needs the administrator role; this controller (op) is operator" in refused.err
    assert desk.sent == [("op", "POST", "/v1/ops/denied")]
    assert store_state(store) == before
    assert audited(store, since) == [("controller:op", "cli:node remove", "denied")]
    with desk.main.client("op") as op:
        raw = op.post("/v1/ops/nodes/c-a/remove")
    assert raw.status_code == 403 and store_state(store) == before


def test_node_info_from_a_workstation_is_refused_as_on_the_main(desk: Desk) -> None:
    """No agent runs here: the main itself and an unknown node are refused
    alike from the workstation and on the main; a child that does not answer
    is said to be unreachable (502 from the API: the node failed, not the main)."""
    desk.main.store.add_node("c-a", "c-a", "child", "127.0.0.1:9", "fp-a")
    for name in ("main", "nothing"):
        remote = desk.at_ws("watcher", "node", "info", name)
        local = desk.at_main("node", "info", name)
        assert remote.code == local.code == 1, name
        assert remote.err == local.err, name
    gone = desk.at_ws("watcher", "node", "info", "c-a")
    assert gone.code == 1 and "cannot reach c-a at 127.0.0.1:9" in gone.err
    assert desk.at_main("node", "info", "c-a").err == gone.err
    with desk.main.client("watcher") as viewer:
        assert viewer.get("/v1/ops/nodes/c-a/info").status_code == 502


def test_model_add_of_a_file_on_the_main_from_a_workstation(desk: Desk, tiny_gguf: Path) -> None:
    """The file is the main's (nothing is uploaded): added alike from the
    workstation and on the main, audited under the controller; a path the
    main has no file at is refused saying so, and changes nothing."""
    store = desk.main.store
    with desk.main.home.config_file.open("a") as config:  # where controllers may add from
        config.write(f"\n[control]\nadd_from = [{json.dumps(str(tiny_gguf.parent))}]\n")
    since = len(store.list_audit())
    remote = desk.at_ws("op", "model", "add", "from-ws", "--gguf", str(tiny_gguf), "--no-serve")
    assert remote.code == 0, remote.err
    assert ("controller:op", "model.add", "ok") in audited(store, since)
    local = desk.at_main("model", "add", "from-main", "--gguf", str(tiny_gguf), "--no-serve")
    assert remote.out.replace("from-ws", "from-main") == local.out
    assert remote.err == local.err == ""
    assert {"from-ws", "from-main"} <= {s.name for s in store.list_services()}

    before = store_state(store)
    for path in ("/nowhere/model.gguf", "model.gguf"):
        missing = desk.at_ws("op", "model", "add", "other", "--gguf", path)
        assert missing.code == 1
        assert "nothing is uploaded" in missing.err and "Nothing changed." in missing.err
    taken = desk.at_ws("op", "model", "add", "from-main", "--gguf", str(tiny_gguf), "--no-serve")
    here = desk.at_main("model", "add", "from-main", "--gguf", str(tiny_gguf), "--no-serve")
    assert taken.code == here.code == 1 and taken.err == here.err
    external = desk.at_ws("op", "model", "add", "ext", "--external", "https://example.com/v1")
    assert external.code == 3 and "nothing was sent" in external.err
    assert store_state(store) == before
    assert desk.at_ws("watcher", "model", "add", "x", "--gguf", str(tiny_gguf)).code == 1
    assert store_state(store) == before


def test_model_pull_from_a_workstation_runs_on_the_main_and_says_what_it_says(
    desk: Desk, hub: Any
) -> None:
    store = desk.main.store
    since = len(store.list_audit())
    pull = ("model", "pull", "org/tiny-gguf", "--quant", "Q8_0", "--no-serve")
    remote = desk.at_ws("op", *pull, "--name", "from-ws")
    assert remote.code == 0, remote.err
    assert ("controller:op", "model.add", "ok") in audited(store, since)
    local = desk.at_main(*pull, "--name", "from-main")
    assert local.code == 0, local.err
    assert remote.out.replace("from-ws", "from-main") == local.out
    assert remote.err == local.err and "is commit" in remote.err
    assert hub.repos["org/tiny-gguf"].commit in remote.out
    [pulled] = [s for s in store.list_services() if s.name == "from-ws"]
    assert pulled.origin is not None and pulled.origin["repo"] == "org/tiny-gguf"

    # Pulled again: nothing changes, said alike; what is not there is refused alike.
    before = store_state(store)
    again = desk.at_ws("op", *pull, "--name", "from-ws")
    assert again.code == 0 and "nothing changed" in again.out
    assert again.out == desk.at_main(*pull, "--name", "from-ws").out
    for argv in (
        ["org/none"],
        ["org/tiny-gguf", "--quant", "Q2_K"],
        ["org/tiny-gguf", "--name", "bad name"],
    ):
        remote = desk.at_ws("op", "model", "pull", *argv, "--no-serve")
        local = desk.at_main("model", "pull", *argv, "--no-serve")
        assert remote.code == local.code == 1, argv
        assert (remote.out, remote.err) == (local.out, local.err), argv
    sent = len(desk.sent)
    both = desk.at_ws("op", "model", "pull", "org/tiny-gguf", "--file", "a", "--quant", "b")
    assert both.code == 2 and len(desk.sent) == sent  # refused here: nothing sent
    with desk.main.client("op") as op:
        raw = op.post(
            "/v1/ops/models/pull", json={"repo": "org/tiny-gguf", "file": "a", "quant": "b"}
        )
        assert raw.status_code == 400
        assert op.post("/v1/ops/models/pull", json={"repo": ""}).status_code == 422
    assert store_state(store) == before
    refused = desk.at_ws("watcher", *pull)
    assert refused.code == 1 and "needs the operator role" in refused.err
    assert store_state(store) == before


@pytest.mark.parametrize("extra", [["--json"], []])
def test_release_list_from_a_workstation_is_the_main_s(desk: Desk, extra: list[str]) -> None:
    remote = desk.at_ws("watcher", "release", "list", *extra)
    assert remote.code == 0, remote.err
    assert (remote.out, remote.err) == (desk.at_main("release", "list", *extra).out, "")
    [group] = desk.main.store.list_placement_groups()
    assert group.release_id in remote.out and group.id in remote.out


def test_webhooks_listed_shown_and_removed_from_a_workstation_as_on_the_main(
    desk: Desk,
) -> None:
    store = desk.main.store
    for url in ("https://hooks.example/a", "https://hooks.example/b"):
        with store.transaction():
            store.add_webhook(url, "whsec_" + "A" * 32, ("model.down",))
    store.queue_webhook_event("evt-1", "model.down", "{}")
    for argv in (
        ["webhook", "list", "--json"],
        ["webhook", "list"],
        ["webhook", "deliveries", "https://hooks.example/a", "--json"],
        ["webhook", "deliveries", "https://hooks.example/a", "--limit", "1"],
        ["webhook", "deliveries", "https://hooks.example/none"],
    ):
        remote = desk.at_ws("fuzz", *argv)
        local = desk.at_main(*argv)
        assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err), argv
    listed = json.loads(desk.at_ws("fuzz", "webhook", "list", "--json").out)
    assert [h["url"] for h in listed] == ["https://hooks.example/a", "https://hooks.example/b"]
    shown = desk.at_ws("fuzz", "webhook", "deliveries", "https://hooks.example/a", "--json")
    assert [d["event"] for d in json.loads(shown.out)] == ["model.down"]

    since = len(store.list_audit())
    remote = desk.at_ws("fuzz", "webhook", "remove", "https://hooks.example/a")
    assert remote.code == 0, remote.err
    assert ("controller:fuzz", "webhook.remove", "ok") in audited(store, since)
    local = desk.at_main("webhook", "remove", "https://hooks.example/b")
    assert remote.out.replace("/a", "/b") == local.out and store.list_webhooks() == []
    gone = desk.at_ws("fuzz", "webhook", "remove", "https://hooks.example/a")
    here = desk.at_main("webhook", "remove", "https://hooks.example/a")
    assert (gone.code, gone.err) == (here.code, here.err) and gone.code == 1

    refused = desk.at_ws("op", "webhook", "list")
    assert refused.code == 1 and "needs the administrator role" in refused.err
    with desk.main.client("op") as op:
        assert op.get("/v1/ops/webhooks").status_code == 403


def test_mirror_unused_from_a_workstation_is_the_main_s(desk: Desk, tmp_path: Path) -> None:
    import hashlib

    loose = tmp_path / "loose.gguf"
    loose.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    added = desk.at_main(
        "mirror", "add", str(loose), "--sha256", hashlib.sha256(loose.read_bytes()).hexdigest()
    )
    assert added.code == 0, added.err
    for extra in (["--json"], []):
        remote = desk.at_ws("watcher", "mirror", "unused", *extra)
        assert remote.code == 0, remote.err
        assert (remote.out, remote.err) == (desk.at_main("mirror", "unused", *extra).out, "")
    [found] = json.loads(desk.at_ws("watcher", "mirror", "unused", "--json").out)
    assert found["names"] == ["loose.gguf"]


def test_model_remove_from_a_workstation_says_what_the_main_says(
    desk: Desk, tiny_gguf: Path
) -> None:
    """A model removed from the workstation, then the same model added again
    and removed on the main: the same words, audited under the controller. A
    model whose groups should run is refused alike until --stop; an unknown
    one too; an operator's attempt is refused before it is sent."""
    store = desk.main.store
    for name in ("keep", "gone"):
        added = desk.at_main("model", "add", name, "--gguf", str(tiny_gguf), "--no-serve")
        assert added.code == 0, added.err
    since = len(store.list_audit())
    remote = desk.at_ws("fuzz", "model", "remove", "gone")
    assert remote.code == 0, remote.err
    assert ("controller:fuzz", "model.remove", "ok") in audited(store, since)
    assert "gone" not in {s.name for s in store.list_services()}
    assert desk.at_main("model", "add", "gone", "--gguf", str(tiny_gguf), "--no-serve").code == 0
    local = desk.at_main("model", "remove", "gone")
    assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err)
    assert remote.out.startswith("removed model gone: 0 placement group(s) removed; its file stays")

    before = store_state(store)
    for argv in (["tiny"], ["nothing"], ["nothing", "--stop"]):
        refused = desk.at_ws("fuzz", "model", "remove", *argv)
        here = desk.at_main("model", "remove", *argv)
        assert refused.code == here.code == 1, argv
        assert refused.err == here.err and "Nothing changed." in here.err, argv
    assert store_state(store) == before
    sent = len(desk.sent)
    denied = desk.at_ws("op", "model", "remove", "keep")
    assert denied.code == 1
    assert "needs the administrator role; this controller (op) is operator" in denied.err
    assert desk.sent[sent:] == [("op", "POST", "/v1/ops/denied")]
    assert audited(store, len(store.list_audit()) - 1) == [
        ("controller:op", "cli:model remove", "denied")
    ]
    with desk.main.client("fuzz") as admin:
        assert admin.post("/v1/ops/models/keep/remove", json={"stop": "x"}).status_code == 422
        assert admin.post("/v1/ops/models/keep/remove", json={"force": True}).status_code == 422
    assert store_state(store) == before

    stopped = desk.at_ws("fuzz", "model", "remove", "tiny", "--stop")  # its group drains first
    assert stopped.code == 0, stopped.err
    assert stopped.out.startswith("removed model tiny: 1 placement group(s) removed")
    assert store.list_placement_groups() == []


def test_a_controller_cannot_make_the_main_open_or_probe_files_outside_its_model_dirs(
    desk: Desk, monkeypatch: pytest.MonkeyPatch, tiny_gguf: Path
) -> None:
    """An operator's controller naming the main's secrets, its authority, a
    path climbing out of the model store or a link in the mirror pointing out
    gets the refusal a missing file gets (naming the directories accepted),
    and the main never looks at a path outside them, let alone opens it."""
    import os
    import threading

    home = desk.main.home
    mirror = MirrorLayout.for_home(home).root
    mirror.mkdir(parents=True, exist_ok=True)
    (mirror / "link.gguf").symlink_to(home.database)
    looked: list[str] = []  # what the main (the app's thread, not the CLI's) looked at
    for name in ("stat", "lstat"):
        real = getattr(os, name)

        def watched(path: Any, *a: Any, _real: Any = real, **k: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():
                looked.append(os.fsdecode(path) if isinstance(path, str | bytes) else str(path))
            return _real(path, *a, **k)

        monkeypatch.setattr(os, name, watched)
    monkeypatch.setattr(
        "letsinfer.control.ops.admission.admit_gguf",
        lambda *a, **k: pytest.fail("a refused file reached admission"),
    )
    store = desk.main.store
    before, since = store_state(store), len(store.list_audit())
    climbing = f"{home.model_store}/../{home.database.relative_to(home.model_store.parent)}"
    outside = [
        "/etc/shadow",
        str(home.database),
        str(tiny_gguf),  # a model file, but where no setting lets controllers add from
        climbing,
    ]
    answers: dict[str, str] = {}
    for path in [*outside, str(home.model_store / "missing.gguf"), str(mirror / "link.gguf")]:
        looked.clear()
        refused = desk.at_ws("op", "model", "add", "x", "--gguf", path, "--no-serve")
        assert refused.code == 1, path
        answers[path] = refused.err.replace(path, "PATH")
        if path in outside:
            assert not [p for p in looked if p in (path, os.path.normpath(path))], path
    [said] = set(answers.values())  # one answer, whatever is (or is not) there
    assert f"under one of {home.model_store}, {mirror}" in " ".join(said.split())
    assert "Nothing changed." in said
    assert store_state(store) == before
    assert not [a for a in audited(store, since) if a[1] == "model.add"]


@pytest.mark.parametrize(
    "argv",
    [
        ["user", "list"],
        ["user", "approve", "someone", "--project", "team"],
        ["user", "grant", "someone", "operator"],
        ["project", "create", "team"],
        ["project", "list"],
        ["project", "remove", "team"],
    ],
)
def test_people_and_projects_stay_with_a_shell_on_the_main(desk: Desk, argv: list[str]) -> None:
    """Even an administrator's controller: refused here, saying why, with
    nothing sent to the main and nothing changed there."""
    before = store_state(desk.main.store)
    refused = desk.at_ws("fuzz", *argv)
    assert refused.code == 3, refused.err
    said = " ".join(refused.err.split())
    assert (
        f"`{' '.join(argv[:2])}` runs only from a shell on the main, never from a controller"
        in said
    )
    assert "a shell on the main is what makes an administrator" in said
    assert "Nothing was sent" in said
    assert desk.sent == []
    assert store_state(desk.main.store) == before


def test_cluster_stop_and_start_from_a_workstation_say_what_the_main_says(
    running_desk: Desk,
) -> None:
    """Stopped and started from the workstation, then on the main: the same
    words and exit codes (no agent here: the group is said not to have
    stopped, then not to be ready), audited under the controller."""
    desk, store = running_desk, running_desk.main.store
    since = len(store.list_audit())
    typed = {}
    for where in ("ws", "main"):
        for verb in ("stop", "start"):
            argv = ("cluster", verb)
            typed[where, verb] = desk.at_ws("op", *argv) if where == "ws" else desk.at_main(*argv)
    assert ("controller:op", "cluster.stop", "ok") in audited(store, since)
    assert ("controller:op", "cluster.start", "ok") in audited(store, since)
    for verb in ("stop", "start"):
        remote, local = typed["ws", verb], typed["main", verb]
        assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err), verb
    [group] = store.list_placement_groups()
    assert typed["ws", "stop"].out.startswith("cluster stopped: 1 placement group(s) stopped")
    assert group.id in typed["ws", "start"].out and group.desired == "running"

    assert desk.at_ws("op", "cluster", "stop").code == 1  # (its engine said nothing)
    before = store_state(store)
    remote, local = desk.at_ws("op", "cluster", "restart"), desk.at_main("cluster", "restart")
    assert remote.code == local.code == 1 and remote.err == local.err
    assert "the cluster is stopped" in remote.err and "Nothing changed." in remote.err
    assert store_state(store) == before


def test_a_viewer_may_not_stop_the_cluster_and_only_the_notice_is_sent(desk: Desk) -> None:
    store = desk.main.store
    before, since = store_state(store), len(store.list_audit())
    for verb in ("stop", "start", "restart"):
        refused = desk.at_ws("watcher", "cluster", verb)
        assert refused.code == 1
        assert "needs the operator role; this controller (watcher) is viewer" in refused.err
    assert desk.sent == [("watcher", "POST", "/v1/ops/denied")] * 3
    assert store_state(store) == before and not lifecycle_stopped(store)
    assert audited(store, since) == [
        ("controller:watcher", f"cli:cluster {v}", "denied") for v in ("stop", "start", "restart")
    ]
    with desk.main.client("watcher") as viewer:
        assert viewer.post("/v1/ops/cluster/stop").status_code == 403
    assert not lifecycle_stopped(store)


def lifecycle_stopped(store: AuthorityStore) -> bool:
    from letsinfer.authority import lifecycle

    return lifecycle.cluster_state(store).stopped


def test_eval_runs_and_show_from_a_workstation_are_the_main_s(desk: Desk) -> None:
    from letsinfer.store.evals import EvalCaseRecord, EvalRunRecord

    store = desk.main.store
    for n, (model, score) in enumerate((("tiny", 0.75), ("other", 1))):
        run = EvalRunRecord(
            f"ev-{n}abc", "smoke", "builtin:smoke", model, None, 0.5, score, True, 2, n, n + 1
        )
        cases = [
            EvalCaseRecord(i, f"case {i}", "exact", 1, score, "ok", f"req-{i}", 200, "4", 12)
            for i in (1, 2)
        ]
        with store.transaction():
            store.add_eval_run(run, cases)
    before = store_state(store)
    for argv in (
        ["eval", "runs"],
        ["eval", "runs", "--json"],
        ["eval", "runs", "--model", "tiny", "--limit", "1", "--json"],
        ["eval", "show", "ev-0", "--json"],
        ["eval", "show", "ev-1abc"],
        ["eval", "show", "nothing"],
        ["eval", "runs", "--limit", "0"],
    ):
        remote = desk.at_ws("watcher", *argv)
        local = desk.at_main(*argv)
        assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err), argv
    shown = json.loads(desk.at_ws("watcher", "eval", "show", "ev-0", "--json").out)
    assert shown["run"] == "ev-0abc" and [c["case"] for c in shown["cases"]] == [1, 2]
    listed = json.loads(desk.at_ws("watcher", "eval", "runs", "--model", "tiny", "--json").out)
    assert [r["run"] for r in listed] == ["ev-0abc"]
    assert "no eval run 'nothing'" in desk.at_ws("watcher", "eval", "show", "nothing").err
    assert store_state(store) == before
    with desk.main.client("watcher") as viewer:
        assert viewer.get("/v1/ops/evals?limit=0").status_code == 422
        assert viewer.get("/v1/ops/evals/nothing").status_code == 404
    with desk.main.client(None) as anyone:
        assert anyone.get("/v1/ops/evals").status_code == 403


@pytest.mark.parametrize("extra", [["--json"], []])
def test_auth_controller_list_from_a_workstation_is_the_main_s(
    desk: Desk, extra: list[str]
) -> None:
    remote = desk.at_ws("watcher", "auth", "controller", "list", *extra)
    assert remote.code == 0, remote.err
    local = desk.at_main("auth", "controller", "list", *extra)
    assert (remote.out, remote.err) == (local.out, local.err)
    assert all(name in remote.out for name in ("fuzz", "op", "watcher"))
    assert desk.sent == [("watcher", "GET", "/v1/ops/controllers")]


@pytest.mark.parametrize("extra", [["--json"], []])
def test_topology_from_a_workstation_is_the_main_s(desk: Desk, extra: list[str]) -> None:
    store = desk.main.store
    store.add_node("c-a", "c-a", "child", "10.0.0.2:8444", "fp-a")
    remote = desk.at_ws("watcher", "topology", *extra)
    assert remote.code == 0, remote.err
    local = desk.at_main("topology", *extra)
    assert (remote.out, remote.err) == (local.out, local.err)
    assert "c-a" in remote.out and "main" in remote.out
    [group] = store.list_placement_groups()
    assert group.id in remote.out


def test_model_plan_from_a_workstation_is_the_main_s(desk: Desk, tiny_gguf: Path) -> None:
    store = desk.main.store
    store.add_node("c-a", "c-a", "child", "10.0.0.2:8444", "fp-a")  # (never heard from)
    before = store_state(store)
    for argv in (
        ["model", "plan", "tiny"],
        ["model", "plan", "tiny", "--json"],
        ["model", "plan", "tiny", "--target", "cpu", "--json"],
        ["model", "plan", "nothing"],
    ):
        remote = desk.at_ws("watcher", *argv)
        local = desk.at_main(*argv)
        assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err), argv
    rows = json.loads(desk.at_ws("watcher", "model", "plan", "tiny", "--json").out)
    assert [r["node"] for r in rows] == ["c-a", "main"]
    assert "no model 'nothing'" in desk.at_ws("watcher", "model", "plan", "nothing").err
    assert store_state(store) == before
    with desk.main.client("watcher") as viewer:
        assert viewer.get("/v1/ops/models/tiny/plan?gpus=0").status_code == 422
        assert viewer.get("/v1/ops/models/tiny/plan?target=tpu").status_code == 422


def test_mirror_remove_from_a_workstation_says_what_the_main_says(
    desk: Desk, tmp_path: Path
) -> None:
    """Two loose artifacts: one removed from the workstation, the other on the
    main, alike, audited under the controller; one still referred to, or not
    there, is refused alike and stays; an operator is refused before sending."""
    import hashlib

    digests = []
    for n in (1, 2):
        loose = tmp_path / f"loose-{n}.gguf"
        loose.write_bytes(b"GGUF" + bytes([n]) * 2048)
        digests.append(hashlib.sha256(loose.read_bytes()).hexdigest())
        added = desk.at_main("mirror", "add", str(loose), "--sha256", digests[-1])
        assert added.code == 0, added.err
    layout = MirrorLayout.for_home(desk.main.home)
    store = desk.main.store
    since = len(store.list_audit())
    remote = desk.at_ws("fuzz", "mirror", "remove", digests[0][:12])
    assert remote.code == 0, remote.err
    assert ("controller:fuzz", "mirror.remove", "ok") in audited(store, since)
    local = desk.at_main("mirror", "remove", digests[1][:12])
    swapped = remote.out.replace("loose-1", "loose-2").replace(digests[0], digests[1])
    assert swapped == local.out and remote.err == local.err == ""
    assert not layout.blob(digests[0]).exists() and not layout.blob(digests[1]).exists()

    [tiny] = store.list_services()
    for digest in (tiny.artifact_digest, digests[0], "zz"):
        again = desk.at_ws("fuzz", "mirror", "remove", digest)
        here = desk.at_main("mirror", "remove", digest)
        assert again.code == here.code == 1 and again.err == here.err, digest
    sent = len(desk.sent)
    denied = desk.at_ws("op", "mirror", "remove", digests[0])
    assert denied.code == 1 and "needs the administrator role" in denied.err
    assert desk.sent[sent:] == [("op", "POST", "/v1/ops/denied")]
    with desk.main.client("fuzz") as admin:
        assert admin.post("/v1/ops/mirror/remove", json={"digest": ""}).status_code == 422


def test_webhook_add_and_test_from_a_workstation_as_on_the_main(desk: Desk, tmp_path: Path) -> None:
    """The workstation reads the secret from its own file and sends it over
    mutual TLS: the main signs with it (the receiver verifies the test), says
    what the main says, and never says the secret back or records it."""
    import re

    from tests.nodes import free_port
    from tests.test_webhooks import SECRET, Receiver

    with desk.main.home.config_file.open("a") as config:
        config.write('\n[fetch]\nallow_networks = ["127.0.0.0/8"]\n')
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    receiver = Receiver(free_port())
    receiver.start()
    try:
        store = desk.main.store
        since = len(store.list_audit())
        said: dict[str, list[Typed]] = {}
        for where, path in (("ws", "/a"), ("main", "/b")):
            argv = ("webhook", "add", receiver.url(path), "--events", "*")
            add = (
                desk.at_ws("fuzz", *argv, "--secret-file", str(secret_file))
                if where == "ws"
                else desk.at_main(*argv, "--secret-file", str(secret_file))
            )
            test = (
                desk.at_ws("fuzz", "webhook", "test", receiver.url(path))
                if where == "ws"
                else desk.at_main("webhook", "test", receiver.url(path))
            )
            said[where] = [add, test]
        for remote, local in zip(said["ws"], said["main"], strict=True):
            assert remote.code == local.code == 0, (remote.err, local.err)
            same = re.sub(r"msg_[0-9a-f]+", "msg_", remote.out.replace("/a", "/b"))
            assert same == re.sub(r"msg_[0-9a-f]+", "msg_", local.out)
        [got] = receiver.at("/a")
        assert got.payload is not None and got.payload["type"] == "webhook.test"  # signed alike
        assert store.get_webhook(receiver.url("/a")).secret == SECRET
        records = audited(store, since)
        assert ("controller:fuzz", "webhook.add", "ok") in records
        assert ("controller:fuzz", "webhook.test", "ok") in records
        assert not [r for r in store.list_audit() if SECRET in repr(r)]
        assert SECRET not in "".join(t.out + t.err for t in said["ws"])

        before = store_state(store)
        sent = len(desk.sent)
        bad = desk.at_ws("fuzz", "webhook", "add", receiver.url("/c"), "--events", "nope",
                         "--secret-file", str(secret_file))  # fmt: skip
        assert bad.code == 2 and len(desk.sent) == sent  # refused here: nothing sent
        for url in (receiver.url("/a"), "http://169.254.169.254/hook"):
            argv = ("webhook", "add", url, "--events", "*", "--secret-file", str(secret_file))
            remote, local = desk.at_ws("fuzz", *argv), desk.at_main(*argv)
            assert remote.code == local.code == 1 and remote.err == local.err, url
        gone = desk.at_ws("fuzz", "webhook", "test", "https://none.example/hook")
        assert (
            gone.code == 1
            and gone.err == desk.at_main("webhook", "test", "https://none.example/hook").err
        )
        denied = desk.at_ws("op", "webhook", "add", receiver.url("/d"), "--events", "*",
                            "--secret-file", str(secret_file))  # fmt: skip
        assert denied.code == 1 and "needs the administrator role" in denied.err
        assert desk.sent[-1] == ("op", "POST", "/v1/ops/denied")
        weak = "whsec_" + base64_of(b"short")
        with desk.main.client("fuzz") as admin:
            raw = admin.post(
                "/v1/ops/webhooks",
                json={"url": receiver.url("/e"), "events": ["*"], "secret": weak},
            )
            assert raw.status_code == 400 and weak not in raw.text
            unknown = {"url": receiver.url("/e"), "events": ["nope"], "secret": SECRET}
            assert admin.post("/v1/ops/webhooks", json=unknown).status_code == 400
        assert store_state(store) == before
    finally:
        receiver.stop()


def base64_of(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode()


def test_model_adapters_added_listed_and_removed_from_a_workstation_as_on_the_main(
    running_desk: Desk, tmp_path: Path
) -> None:
    """An adapter file the main holds, under a directory controllers may add
    from: added, listed and removed from the workstation with the main's
    words, audited under the controller; a file elsewhere is refused as a
    missing one; a viewer is refused before sending."""
    from letsinfer.engines.tinymodel import write_tiny_lora

    desk, store = running_desk, running_desk.main.store
    set_desired(store, "stopped")  # (no agent here to restart its group with the adapter)
    loras = tmp_path / "loras"
    loras.mkdir()
    lora = write_tiny_lora(loras / "tuned.gguf")
    with desk.main.home.config_file.open("a") as config:
        config.write(f"\n[control]\nadd_from = [{json.dumps(str(loras))}]\n")
    since = len(store.list_audit())
    remote = desk.at_ws("op", "model", "adapter", "add", "tiny", "lo-ws", "--gguf", str(lora))
    local = desk.at_main("model", "adapter", "add", "tiny", "lo-main", "--gguf", str(lora))
    assert remote.code == local.code == 0, (remote.err, local.err)
    assert remote.out.replace("lo-ws", "lo-main") == local.out and remote.err == local.err
    assert ("controller:op", "model.adapter.add", "ok") in audited(store, since)
    for argv in (["--json"], ["tiny"], ["nothing"]):
        seen = desk.at_ws("watcher", "model", "adapter", "list", *argv)
        here = desk.at_main("model", "adapter", "list", *argv)
        assert (seen.code, seen.out, seen.err) == (here.code, here.out, here.err), argv
    listed = json.loads(desk.at_ws("watcher", "model", "adapter", "list", "--json").out)
    assert sorted(a["name"] for a in listed) == ["lo-main", "lo-ws"]

    before = store_state(store)
    adapters_before = store.list_adapters()
    for path in ("/etc/shadow", str(desk.main.home.database), str(loras / "none.gguf")):
        refused = desk.at_ws("op", "model", "adapter", "add", "tiny", "x", "--gguf", path)
        assert refused.code == 1 and "Nothing changed." in refused.err, path
        assert f"under one of {desk.main.home.model_store}" in " ".join(refused.err.split())
    denied = desk.at_ws("watcher", "model", "adapter", "add", "tiny", "x", "--gguf", str(lora))
    assert denied.code == 1 and "needs the operator role" in denied.err
    assert desk.sent[-1] == ("watcher", "POST", "/v1/ops/denied")
    for name in ("nothing", "tiny"):  # no adapter; a model, not an adapter
        gone = desk.at_ws("op", "model", "adapter", "remove", name)
        here = desk.at_main("model", "adapter", "remove", name)
        assert gone.code == here.code == 1 and gone.err == here.err, name
    assert store_state(store) == before and store.list_adapters() == adapters_before

    since = len(store.list_audit())
    remote = desk.at_ws("op", "model", "adapter", "remove", "lo-ws")
    local = desk.at_main("model", "adapter", "remove", "lo-main")
    assert remote.code == local.code == 0, (remote.err, local.err)
    assert remote.out.replace("lo-ws", "lo-main") == local.out
    assert ("controller:op", "model.adapter.remove", "ok") in audited(store, since)
    assert store.list_adapters() == []


def test_model_gate_shown_set_and_cleared_from_a_workstation_as_on_the_main(
    desk: Desk, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Shown by a viewer, set and cleared by an operator: the main's words and
    exit codes, audited under the controller. A viewer's change is refused
    before it is sent; a suite file (a workstation's path) is refused before
    it is sent, and the main itself takes only a built-in suite's name."""
    from types import SimpleNamespace

    monkeypatch.setattr("letsinfer.store.weights.time", SimpleNamespace(time=lambda: 1.8e9))
    store = desk.main.store

    def both(controller: str, *argv: str) -> Typed:
        """Typed at the workstation, then (the gate as it was before) at the main."""
        kept = store.get_gate("tiny")
        remote = desk.at_ws(controller, "model", "gate", *argv)
        with store.transaction():
            store.clear_gate("tiny")
            if kept is not None:
                store.set_gate("tiny", kept.suite, kept.min_score, kept.set_by)
        local = desk.at_main("model", "gate", *argv)
        assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err), argv
        return remote

    since = len(store.list_audit())
    for extra in ([], ["--json"]):
        assert both("watcher", "tiny", *extra).code == 0
        assert both("op", "tiny", "--suite", "arithmetic", "--min-score", "0.5", *extra).code == 0
        assert both("watcher", "tiny", *extra).code == 0
        assert both("op", "tiny", "--clear", *extra).code == 0
        assert both("op", "tiny", "--clear", *extra).code == 0
    said = desk.at_ws("op", "model", "gate", "tiny", "--suite", "arithmetic", "--min-score", "0.5")
    assert (
        said.out
        == "gate of tiny: suite arithmetic, min score 0.5 (set 2027-01-15T08:00:00+00:00)\n"
    )
    assert json.loads(desk.at_ws("watcher", "model", "gate", "tiny", "--json").out) == {
        "model": "tiny",
        "suite": "arithmetic",
        "min_score": 0.5,
        "set_at": "2027-01-15T08:00:00+00:00",
    }
    done = audited(store, since)
    assert ("controller:op", "model.gate.set", "ok") in done
    assert ("controller:op", "model.gate.clear", "ok") in done
    assert ("cli", "model.gate.set", "ok") in done

    kept = store.get_gate("tiny")
    since, sent = len(store.list_audit()), len(desk.sent)
    for argv in (["--clear"], ["--suite", "json-format", "--min-score", "1"]):
        denied = desk.at_ws("watcher", "model", "gate", "tiny", *argv)
        assert denied.code == 1, argv
        assert "needs the operator role; this controller (watcher) is viewer" in denied.err
    assert desk.sent[sent:] == [("watcher", "POST", "/v1/ops/denied")] * 2
    assert audited(store, since) == [("controller:watcher", "cli:model gate", "denied")] * 2

    suite = tmp_path / "suite.yaml"
    suite.write_text("name: mine\ncases: []\n")
    sent = len(desk.sent)
    refused = desk.at_ws("op", "model", "gate", "tiny", "--suite", str(suite), "--min-score", "1")
    assert refused.code == 2 and "a gate's suite is a built-in one" in refused.err
    assert "Nothing was sent." in " ".join(refused.err.split())
    assert desk.sent[sent:] == []
    for argv in (
        ["nothing"],
        ["nothing", "--clear"],
        ["nothing", "--suite", "arithmetic", "--min-score", "1"],
    ):
        assert both("op", *argv).code == 1
    with desk.main.client("op") as op:
        for body in (
            {"suite": str(desk.main.home.database), "min_score": 0.5},
            {"suite": "arithmetic", "min_score": 2},
            {"suite": "arithmetic"},
        ):
            answer = op.post("/v1/ops/models/tiny/gate", json=body)
            assert answer.status_code in (400, 422), body
    assert store.get_gate("tiny") == kept
    assert audited(store, since)[2:] == []


def test_model_rollback_weights_from_a_workstation_as_on_the_main(running_desk: Desk) -> None:
    """Weights the model ran before, by their commit: rolled back from the
    workstation on the main's loop, audited under the controller; weights it
    never ran and a model that is not there are refused with the main's words
    and nothing changed; a viewer is refused before it is sent."""
    desk, store = running_desk, running_desk.main.store
    [svc] = store.list_services()
    commit = "c0ffee" + "0" * 34
    origin = {"repo": "org/tiny", "revision": "main", "commit": commit, "files": []}
    with store.transaction():
        store.add_weights_history("tiny", svc.artifact_digest, svc.artifact_size, origin, "pulled")
    before = store_state(store)
    for argv in (["tiny", "--weights", "deadbeef"], ["nothing", "--weights", "c0ffee0"]):
        remote = desk.at_ws("op", "model", "rollback", *argv)
        local = desk.at_main("model", "rollback", *argv)
        assert remote.code == local.code == 1, (argv, remote.err)
        assert remote.err == local.err and remote.out == local.out, argv
    assert (
        "never ran weights 'deadbeef'"
        in desk.at_ws("op", "model", "rollback", "tiny", "--weights", "deadbeef").err
    )
    assert store_state(store) == before

    sent = len(desk.sent)
    denied = desk.at_ws("watcher", "model", "rollback", "tiny", "--weights", "c0ffee0")
    assert denied.code == 1 and "needs the operator role" in denied.err
    assert desk.sent[sent:] == [("watcher", "POST", "/v1/ops/denied")]
    assert store_state(store) == before

    for extra in (["--json"], []):
        since = len(store.list_audit())
        argv = ("model", "rollback", "tiny", "--weights", "c0ffee0", *extra)
        remote = desk.at_ws("op", *argv)
        assert remote.code == 0, remote.err
        assert ("controller:op", "model.rollback.weights", "ok") in audited(store, since)
        local = desk.at_main(*argv)
        assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err)
    assert remote.out.startswith("rollback of tiny to weights c0ffee0:")


def test_model_update_from_a_workstation_downloads_on_the_main_and_says_what_it_says(
    running_desk: Desk, hub: Any, tmp_path: Path
) -> None:
    """A pulled model moved to its repository's new commit from the
    workstation: downloaded and verified on the main, rolled out on its loop,
    with the main's words (the download's included) and exit code, audited
    under the controller; an update to the commit it runs, a model that is
    not there and one with no origin alike; a viewer is refused before it is
    sent."""
    from letsinfer.engines.tinymodel import write_tiny_model

    desk, store = running_desk, running_desk.main.store
    pull = ("model", "pull", "org/tiny-gguf", "--quant", "Q8_0", "--no-serve", "--name")
    for name in ("up-ws", "up-main"):
        assert desk.at_main(*pull, name).code == 0
    newer = write_tiny_model(tmp_path / "newer.gguf", "Q8_0", name="newer")
    commit = hub.add_repo("org/tiny-gguf", {"tiny-gguf-Q8_0.gguf": newer})
    since = len(store.list_audit())
    remote = desk.at_ws("op", "model", "update", "up-ws")
    assert remote.code == 0, remote.err
    assert ("controller:op", "model.update", "ok") in audited(store, since)
    local = desk.at_main("model", "update", "up-main")
    assert local.code == 0, local.err
    assert remote.out.replace("up-ws", "up-main") == local.out
    assert remote.err == local.err and f"is commit {commit}" in remote.err
    assert remote.out.startswith(f"update of up-ws to org/tiny-gguf@{commit[:12]} (sha256:")
    [updated] = [s for s in store.list_services() if s.name == "up-ws"]
    assert updated.origin is not None and updated.origin["commit"] == commit

    before = store_state(store)
    for argv in (["up-ws"], ["up-ws", "--json"], ["nothing"], ["tiny"]):
        remote = desk.at_ws("op", "model", "update", *argv)
        local = desk.at_main("model", "update", *argv)
        assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err), argv
    assert "nothing changed" in desk.at_ws("op", "model", "update", "up-ws").out
    assert "has no recorded origin" in desk.at_ws("op", "model", "update", "tiny").err
    sent = len(desk.sent)
    denied = desk.at_ws("watcher", "model", "update", "up-ws", "--revision", "main")
    assert denied.code == 1 and "needs the operator role" in denied.err
    assert desk.sent[sent:] == [("watcher", "POST", "/v1/ops/denied")]
    with desk.main.client("op") as op:
        for body in ({"canary": 100}, {"revision": ""}, {"sha256": "00"}):
            answer = op.post("/v1/ops/models/up-ws/update-from-origin", json=body)
            assert answer.status_code == 422, body
    assert store_state(store) == before


def test_exposure_status_from_a_workstation_is_the_main_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not published, then published with a certificate the cluster CA
    issued: a viewer's workstation prints what the main prints, --json too,
    the running node's TLS port included (read where the node keeps it)."""
    from letsinfer import config
    from letsinfer.authority.bootstrap import init_main

    port = {"listening": True, "port": 9443, "sources": ["10.0.0.0/8"], "error": None}

    async def facts() -> tuple[list[str], float, dict[str, object]]:
        return [], 30.0, port

    monkeypatch.setattr("letsinfer.cli.exposure.ask_node", lambda *a, **k: port)
    home = Home.under(tmp_path / "main")
    init_main(home, config.load(home.config_file), name="main")
    with served(home, scene=facts) as m:
        desk = Desk(m, tmp_path / "ws", monkeypatch)
        for published in (False, True):
            for extra in ([], ["--json"]):
                remote = desk.at_ws("watcher", "exposure", "status", *extra)
                local = desk.at_main("exposure", "status", *extra)
                assert remote.code == 0, remote.err
                assert (remote.out, remote.err) == (local.out, local.err), (published, extra)
            if not published:
                assert remote.out.startswith('{\n  "published": false')
                enable = ("--cluster-ca", "--san", "gw.example", "--port", "9443")
                made = desk.at_main("exposure", "enable", *enable, "--from", "10.0.0.0/8")
                assert made.code == 0, made.err
        shown = json.loads(remote.out)
        assert shown["published"] and shown["node"] == port
        assert shown["certificate"]["sans"] == ["DNS:gw.example"]
        assert "node      serving" in desk.at_ws("watcher", "exposure", "status").out
        closed = desk.at_ws("fuzz", "exposure", "disable")  # (tests/test_admin_api_access.py)
        assert closed.code == 0 and closed.out.startswith("closed: "), closed.err
