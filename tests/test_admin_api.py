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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from letsinfer.audit.anchor import open_authority
from letsinfer.audit.denials import DenialLog
from letsinfer.authority import controllers
from letsinfer.config import LifecycleSettings
from letsinfer.control.app import ControlContext, create_control_app
from letsinfer.control.ops.openapi import DOCUMENT, admin_openapi, rendered
from letsinfer.gateway.routing import RoutingTable
from letsinfer.home import Home
from letsinfer.identity import load_identity
from letsinfer.lifecycle.routes import ServingRollouts
from letsinfer.lifecycle.serving import Serving
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.store import AuthorityStore
from letsinfer.trust import pki
from letsinfer.trust.material import ClusterCA
from letsinfer.trust.peer import Receive, Scope, Send
from tests.nodes import letsinfer

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Main:
    home: Home
    store: AuthorityStore
    app: Any  # the control plane's ASGI app (its PeerGate)
    certs: dict[str, bytes]  # controller name -> its certificate (DER)

    def as_controller(self, name: str | None) -> Any:
        """The control app, reached with this controller's certificate where
        the mutual-TLS protocol puts the verified one (None: no certificate)."""
        der = self.certs[name] if name else None

        async def presented(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                scope.setdefault("extensions", {})["tls"] = {
                    "client_cert_chain": [],
                    "client_cert_der": der,
                }
            await self.app(scope, receive, send)

        return presented

    def client(self, name: str | None) -> TestClient:
        return TestClient(self.as_controller(name), base_url="https://main")


def pair(store: AuthorityStore, ca: ClusterCA, role: str, name: str) -> bytes:
    code = controllers.new_pairing(store, ca.fingerprint, role, name, 600)
    csr = pki.make_csr(pki.new_key(), "controller").decode()
    _, cert_pem = controllers.pair(store, ca, code.code, csr, lambda reason: None)
    return pki.load_cert(cert_pem).public_bytes(serialization.Encoding.DER)


@pytest.fixture(scope="module")
def main(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Main]:
    path = tmp_path_factory.mktemp("admin-api") / "home"
    made = letsinfer(path, "node", "init", "--main", "--name", "main")
    assert made.returncode == 0, made.stderr
    home = Home.resolve(str(path))
    identity = load_identity(home.identity_file)
    assert identity is not None
    store = open_authority(home)
    ca = ClusterCA(home, identity)
    serving = Serving(store, RoutingTable(), lambda: None, LifecycleSettings())
    ctx = ControlContext(
        store=store,
        ca=ca,
        identity=identity,
        gateway_url="http://127.0.0.1:9/v1",
        heartbeat_interval_s=1.0,
        reports=cast(Any, None),  # no node reports here
        model_store=home.model_store,
        mirror=MirrorLayout.for_home(home),
        release_key="",
        denials=DenialLog(store),
        home=home,
        rollouts=ServingRollouts(serving),
    )
    certs = {
        name: pair(store, ca, role, name)
        for name, role in (("fuzz", "administrator"), ("op", "operator"), ("watcher", "viewer"))
    }
    try:
        yield Main(home, store, create_control_app(ctx), certs)
    finally:
        store.close()


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


def store_state(store: AuthorityStore) -> str:
    """Everything a mutating admin operation may change, as one comparable text."""
    return repr(
        (
            store.list_api_keys(include_revoked=True),
            store.list_services(),
            [(n.id, n.paused, n.state) for n in store.list_nodes(include_removed=True)],
            [(g.id, g.desired, g.state) for g in store.list_placement_groups()],
            store.list_controllers(),
        )
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
        ("/v1/ops/nodes/main/pause", None),
        ("/v1/ops/models/tiny/scale", {"max_groups": 3}),
        ("/v1/ops/nodes/main/resume", None),
    ]
    with main.client("fuzz") as admin:
        for path, body in named:
            watch.check("POST", path, lambda p=path, b=body: admin.post(p, json=b))
    assert watch.seen.get("POST 2xx", 0) >= 8, watch.seen


def test_a_selected_controller_refuses_here_what_it_cannot_send(tmp_path: Path) -> None:
    """A workstation paired as a viewer: operator work and commands with no
    remote operation are refused before anything goes to the main (here no
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
    for argv in (["model", "stop", "tiny"], ["auth", "controller", "add", "--role", "viewer"]):
        refused = letsinfer(ws, *argv)
        assert refused.returncode == 3, refused.stderr
        assert "has no operation in the admin API yet" in refused.stderr
        assert "nothing was sent" in refused.stderr
    unknown = letsinfer(ws, "usage", env={"LETSINFER_CONTROLLER": "nobody"})
    assert unknown.returncode == 1 and "no main paired as 'nobody'" in unknown.stderr

    assert letsinfer(ws, "controller", "use", "--clear").returncode == 0
    here = letsinfer(ws, "usage")  # nothing selected: this machine's, and it is no node
    assert here.returncode == 3 and "not a letsinfer node" in here.stderr
