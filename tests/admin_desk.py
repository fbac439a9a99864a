"""What the admin API tests share: a main's control plane served in-process
(real control app, real PeerGate, real controller certificates issued by the
home's cluster CA, presented where the mutual-TLS protocol puts them), and a
Desk: the main's own CLI beside a workstation paired with it as each of the
main's controllers, so a test types one command at both and compares."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient

from letsinfer.audit.anchor import open_authority
from letsinfer.audit.denials import DenialLog
from letsinfer.authority import controllers
from letsinfer.config import LifecycleSettings
from letsinfer.control.app import ControlContext, create_control_app
from letsinfer.control.removal_notice import tell_removed
from letsinfer.gateway.routing import RoutingTable
from letsinfer.home import Home
from letsinfer.identity import load_identity
from letsinfer.lifecycle.routes import ServingRollouts
from letsinfer.lifecycle.serving import Serving
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.store import AuthorityStore
from letsinfer.trust import pki
from letsinfer.trust.material import ClusterCA, tls_files
from letsinfer.trust.peer import Receive, Scope, Send
from tests.nodes import letsinfer


@dataclass
class Main:
    home: Home
    store: AuthorityStore
    app: Any  # the control plane's ASGI app (its PeerGate)
    certs: dict[str, bytes]  # controller name -> its certificate (DER)
    serving: Serving | None = None  # the lifecycle work the main's gateway loop does

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
    home.config_file.write_text("[hub]\nenabled = false\n")  # a fuzzed pull asks no one
    with served(home) as m:
        yield m


@contextmanager
def served(
    home: Home, lifecycle: LifecycleSettings | None = None, scene: Any = None
) -> Iterator[Main]:
    """The control plane of the main in ``home``, with a controller paired in
    each role: fuzz (administrator), op (operator), watcher (viewer)."""
    identity = load_identity(home.identity_file)
    assert identity is not None
    store = open_authority(home)
    ca = ClusterCA(home, identity)
    serving = Serving(store, RoutingTable(), lambda: None, lifecycle or LifecycleSettings())
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
        scene=scene,  # what only the running gateway knows (None: the settings' word)
        # What the running main does after a removal but stop routing (none routes here).
        on_removed=lambda removal: tell_removed(
            tls_files(home, identity), removal.node, store, "main"
        ),
    )
    certs = {
        name: pair(store, ca, role, name)
        for name, role in (("fuzz", "administrator"), ("op", "operator"), ("watcher", "viewer"))
    }
    try:
        yield Main(home, store, create_control_app(ctx), certs, serving)
    finally:
        store.close()


def store_state(store: AuthorityStore) -> str:
    """Everything a mutating admin operation may change, as one comparable text."""
    return repr(
        (
            store.list_api_keys(include_revoked=True),
            store.list_services(),
            [(n.id, n.paused, n.state) for n in store.list_nodes(include_removed=True)],
            [(g.id, g.desired, g.state) for g in store.list_placement_groups()],
            store.list_controllers(),
            store.list_webhooks(),
            [store.get_gate(s.name) for s in store.list_services()],
        )
    )


@dataclass
class Typed:
    code: int
    out: str
    err: str


class Desk:
    """The main's own CLI (no node process: it writes the authority, reading
    states as a running main would) and a workstation paired with it as each
    of the main's controllers."""

    def __init__(self, main: Main, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        import httpx

        self.main = main
        self.ws = ws
        for name, role in (("fuzz", "administrator"), ("op", "operator"), ("watcher", "viewer")):
            files = ws / "etc/controller/mains" / name
            files.mkdir(parents=True)
            (files / "controller.json").write_text(
                json.dumps(
                    {"main": "main:8443", "main_id": "n", "controller_id": name, "role": role}
                )
            )
        self.sent: list[tuple[str, str, str]] = []  # (controller, method, path)
        self.streamed: list[str] = []  # each streamed answer's body, as the CLI read it

        def request(method: str, url: str, json: Any = None, **_: Any) -> Any:
            controller = self.current
            path = "/" + url.split("://", 1)[1].partition("/")[2]
            self.sent.append((controller, method, path))
            with main.client(controller) as client:
                return client.request(method, path, json=json)

        @contextmanager
        def stream(
            method: str, url: str, json: Any = None, headers: Any = None, **_: Any
        ) -> Iterator[Any]:
            controller = self.current
            path = "/" + url.split("://", 1)[1].partition("/")[2]
            self.sent.append((controller, method, path))
            with (
                main.client(controller) as client,
                client.stream(method, path, json=json, headers=headers) as answer,
            ):
                answer.read()
                self.streamed.append(answer.text)
                yield answer

        monkeypatch.setattr(httpx, "request", request)
        monkeypatch.setattr(httpx, "stream", stream)
        monkeypatch.setattr("letsinfer.trust.peer.client_context", lambda *files: None)
        # The main's CLI reads states as with its node running (as the API does).
        monkeypatch.setattr("letsinfer.cli.shown.node_runs_here", lambda home: True)
        self.current = ""

    def _run(self, home: Path, *args: str) -> Typed:
        from click.testing import CliRunner

        from letsinfer.cli import cli

        done = CliRunner().invoke(cli, ["--home", str(home), *args])
        if done.exception is not None and not isinstance(done.exception, SystemExit):
            raise done.exception
        return Typed(done.exit_code, done.stdout, done.stderr)

    def at_main(self, *args: str) -> Typed:
        return self._run(self.main.home.etc.parent, *args)

    def at_ws(self, controller: str, *args: str) -> Typed:
        self.current = controller
        return self._run(self.ws, "--controller", controller, *args)


@pytest.fixture
def desk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Desk]:
    from letsinfer import config
    from letsinfer.authority.bootstrap import init_main

    home = Home.under(tmp_path / "main")
    init_main(home, config.load(home.config_file), name="main")
    with served(home) as m:
        yield Desk(m, tmp_path / "ws", monkeypatch)


@pytest.fixture
def hub(tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A hub on loopback with one repository, the one the main's settings name."""
    from tests.hubserver import FakeHub

    server = FakeHub().start()
    server.add_repo("org/tiny-gguf", {"tiny-gguf-Q8_0.gguf": tiny_gguf})
    for key, value in {
        "LETSINFER_HUB__ENDPOINT": server.url,
        "LETSINFER_FETCH__ALLOW_NETWORKS": "127.0.0.0/8",
        "HF_ENDPOINT": "http://127.0.0.1:9",  # huggingface_hub's own: never the internet
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }.items():
        monkeypatch.setenv(key, value)
    try:
        yield server
    finally:
        server.stop()


def audited(store: AuthorityStore, since: int) -> list[tuple[str, str, str]]:
    return [(r.actor, r.action, r.outcome) for r in store.list_audit()[since:]]


def set_desired(store: AuthorityStore, desired: str) -> None:
    from letsinfer.authority import lifecycle

    lifecycle.set_model_desired(store, "tiny", desired, actor="test")


@pytest.fixture
def running_desk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Desk]:
    """A Desk whose main CLI reaches its lifecycle routes as with its node
    running (the admin socket's, as a local administrator), with lifecycle
    waits short: no agent runs here to start or stop an engine."""
    from letsinfer import config
    from letsinfer.authority.bootstrap import init_main
    from letsinfer.control.admin_socket import Credentials, local_peer
    from letsinfer.control.typed_app import typed_app
    from letsinfer.lifecycle.routes import lifecycle_router

    monkeypatch.setattr("letsinfer.lifecycle.cluster.STOP_WAIT_S", 0.2)
    home = Home.under(tmp_path / "main")
    init_main(home, config.load(home.config_file), name="main")
    waits = LifecycleSettings(start_timeout_s=0.5, drain_timeout_s=0.5)
    with served(home, waits) as m:
        assert m.serving is not None
        socket_app = typed_app("the main's admin socket")
        socket_app.include_router(lifecycle_router(m.serving, home))
        root = local_peer(Credentials(pid=1, uid=0, gid=0))

        async def gate(scope: Scope, receive: Receive, send: Send) -> None:
            scope.setdefault("state", {})["peer"] = root
            await socket_app(scope, receive, send)

        def ask_node(home: Home, method: str, path: str, json: Any = None, **_: Any) -> Any:
            with TestClient(gate, base_url="http://admin") as client:
                answer = client.request(method, path, json=json)
            if answer.status_code != 200:
                import click

                raise click.ClickException(answer.json()["error"]["message"])
            return answer.json()

        monkeypatch.setattr("letsinfer.cli.local.ask_node", ask_node)
        yield Desk(m, tmp_path / "ws", monkeypatch)
