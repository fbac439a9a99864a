"""Signed webhooks, end to end on a real main node: an endpoint (a small
HTTP server here, on loopback) verifies every delivery with the
``standardwebhooks`` library; a failing one is retried under the same
webhook-id until it answers 200; one answering 410 is disabled; a delivery
queued while the endpoint is down survives a main restart; and what
`webhook add` must refuse leaves nothing recorded."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority.bootstrap import init_main
from letsinfer.cli.local import ask_node
from letsinfer.home import Home
from letsinfer.webhooks.dispatch import Dispatcher
from tests.nodes import RunningNode, free_port, letsinfer, start_node

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
ALLOW = "LETSINFER_FETCH__ALLOW_NETWORKS"
FAST = {
    ALLOW: "127.0.0.0/8",
    "LETSINFER_WEBHOOKS__INTERVAL_S": "0.2",
    "LETSINFER_WEBHOOKS__RETRY_BASE_S": "0.3",
    "LETSINFER_WEBHOOKS__RETRY_MAX_S": "1",
}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    payload: dict[str, object] | None  # None: the signature did not verify


@dataclass
class Receiver:
    """Endpoints at paths of one loopback server: each answers the statuses
    queued for it (then 200) and verifies every delivery's signature."""

    port: int
    secret: str = SECRET
    answers: dict[str, list[int]] = field(default_factory=dict)
    got: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    payload = Webhook(receiver.secret).verify(body, headers)
                except WebhookVerificationError:
                    payload = None
                receiver.got.append(Received(self.path, headers, body, payload))
                queued = receiver.answers.get(self.path) or []
                status = queued.pop(0) if queued else 200
                self.send_response(status if payload is not None else 400)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def at(self, path: str) -> list[Received]:
        return [r for r in self.got if r.path == path]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(free_port())
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    running = start_node(tmp_path_factory.mktemp("webhooks") / "home", env=FAST)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "webhook.secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def wait(what: str, check: Callable[[], object], timeout: float = 60) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {what}")


def add(node: RunningNode, url: str, secret_file: Path, events: str = "*") -> None:
    added = node.cli("webhook", "add", url, "--events", events, "--secret-file", str(secret_file))
    assert added.returncode == 0, added.stderr


def hooks(node: RunningNode) -> dict[str, dict[str, object]]:
    listed = node.cli("webhook", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {h["url"]: h for h in json.loads(listed.stdout)}


def deliveries(node: RunningNode, url: str) -> list[dict[str, object]]:
    shown = node.cli("webhook", "deliveries", url, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)  # type: ignore[no-any-return]


def audit(node: RunningNode, action: str) -> list[dict[str, object]]:
    records = json.loads(node.cli("audit", "list", "--json").stdout)
    return [r for r in records if r["action"] == action]


def refuse_a_load(home: Path, model: str) -> None:
    """The record the capacity controller appends when a load fits nowhere
    (letsinfer.capacity.placing): the dispatcher follows the audit chain."""
    store = open_authority(Home.resolve(home))
    try:
        store.append_audit("capacity", "model.load", "denied", target=model, detail="fits nowhere")
    finally:
        store.close()


def verified(got: list[Received]) -> list[dict[str, object]]:
    assert all(r.payload is not None for r in got), "a delivery did not verify"
    return [r.payload for r in got if r.payload is not None]


# -- refusals: nothing recorded ------------------------------------------------------


def test_add_refuses_unknown_events_a_bad_secret_and_loopback_unless_allowed(
    node: RunningNode, receiver: Receiver, secret_file: Path, tmp_path: Path
) -> None:
    url = receiver.url("/refused")
    unknown = node.cli(
        "webhook",
        "add",
        url,
        "--events",
        "model.parked,model.exploded",
        "--secret-file",
        str(secret_file),
    )
    assert unknown.returncode != 0
    assert "'model.exploded'" in unknown.stderr and "model.parked" in unknown.stderr
    assert "capacity.exhausted" in unknown.stderr  # the known list is shown

    for text in (
        "not-a-secret",
        "whsec_!!!not base64!!!",
        "whsec_" + base64.b64encode(b"short").decode(),
    ):
        bad = tmp_path / "bad.secret"
        bad.write_text(text)
        bad.chmod(0o600)
        refused = node.cli("webhook", "add", url, "--events", "*", "--secret-file", str(bad))
        assert refused.returncode != 0, text
        assert "secret" in refused.stderr and str(bad) in refused.stderr
    readable = tmp_path / "readable.secret"
    readable.write_text(SECRET)
    readable.chmod(0o644)
    shared = node.cli("webhook", "add", url, "--events", "*", "--secret-file", str(readable))
    assert shared.returncode != 0 and "every user" in shared.stderr
    missing = node.cli(
        "webhook", "add", url, "--events", "*", "--secret-file", str(tmp_path / "absent")
    )
    assert missing.returncode != 0

    closed = {k: v for k, v in node.env.items() if k != ALLOW}
    loopback = letsinfer(
        node.home,
        "webhook",
        "add",
        url,
        "--events",
        "*",
        "--secret-file",
        str(secret_file),
        env=closed,
    )
    assert loopback.returncode != 0
    assert "127.0.0.1" in loopback.stderr and "[fetch] allow_networks" in loopback.stderr

    assert url not in hooks(node)
    assert not [r for r in audit(node, "webhook.add") if r["target"] == url]


# -- deliveries ----------------------------------------------------------------------


def test_webhook_test_arrives_signed_and_is_logged(
    node: RunningNode, receiver: Receiver, secret_file: Path
) -> None:
    url = receiver.url("/test")
    add(node, url, secret_file, "model.parked")
    tested = node.cli("webhook", "test", url)
    assert tested.returncode == 0, tested.stderr
    assert "answered 200" in tested.stdout
    [body] = verified(receiver.at("/test"))
    assert body["type"] == "webhook.test"
    [logged] = deliveries(node, url)
    assert logged["event"] == "webhook.test" and logged["state"] == "delivered"
    assert logged["id"] == receiver.at("/test")[0].headers["webhook-id"]

    receiver.answers["/test"] = [503]
    failed = node.cli("webhook", "test", url)
    assert failed.returncode != 0 and "answered 503" in failed.stderr

    [added] = [r for r in audit(node, "webhook.add") if r["target"] == url]
    assert added["detail"] == "model.parked"
    secret_text = SECRET.removeprefix("whsec_")
    shown = node.cli("audit", "list", "--json").stdout + node.cli("webhook", "list").stdout
    assert secret_text not in shown and secret_text not in node.log()
    removed = node.cli("webhook", "remove", url)
    assert removed.returncode == 0, removed.stderr
    assert url not in hooks(node)
    assert [r["target"] for r in audit(node, "webhook.remove")] == [url]


def test_a_failing_endpoint_is_retried_with_the_same_id_until_it_answers(
    node: RunningNode, receiver: Receiver, secret_file: Path
) -> None:
    url = receiver.url("/flaky")
    add(node, url, secret_file, "capacity.exhausted,node.removed")
    receiver.answers["/flaky"] = [500, 500]
    refuse_a_load(node.home, "huge")
    wait("a third attempt", lambda: len(receiver.at("/flaky")) >= 3)
    got = receiver.at("/flaky")
    bodies = verified(got)
    assert {r.headers["webhook-id"] for r in got} == {got[0].headers["webhook-id"]}
    assert all(b["type"] == "capacity.exhausted" for b in bodies)
    assert bodies[0]["data"]["model"] == "huge"  # type: ignore[index]
    [shown] = wait(
        "delivered in the log",
        lambda: [d for d in deliveries(node, url) if d["state"] == "delivered"],
    )  # type: ignore[misc]
    assert shown["id"] == got[0].headers["webhook-id"]
    assert shown["attempts"] == 3 and shown["last_status"] == "200"
    assert shown["delivered_at"]


def test_an_endpoint_answering_410_is_disabled_and_gets_nothing_more(
    node: RunningNode, receiver: Receiver, secret_file: Path
) -> None:
    gone, other = receiver.url("/gone"), receiver.url("/other")
    add(node, gone, secret_file, "capacity.exhausted")
    receiver.answers["/gone"] = [410]
    refuse_a_load(node.home, "first")
    wait("disabled", lambda: hooks(node)[gone]["state"] == "disabled")
    assert "410" in str(hooks(node)[gone]["disabled_reason"])
    assert [r["target"] for r in audit(node, "webhook.disable")].count(gone) == 1
    add(node, other, secret_file, "capacity.exhausted")
    refuse_a_load(node.home, "second")
    wait("the other endpoint got the second event", lambda: receiver.at("/other"))
    assert len(receiver.at("/gone")) == 1  # the 410, nothing after it
    verified(receiver.got)


def test_an_event_is_delivered_once_per_endpoint_and_only_if_subscribed(
    node: RunningNode, receiver: Receiver, secret_file: Path
) -> None:
    add(node, receiver.url("/parked-only"), secret_file, "model.parked")
    add(node, receiver.url("/all"), secret_file, "*")
    refuse_a_load(node.home, "once")
    wait("delivered", lambda: receiver.at("/all"))
    node.cli("webhook", "test", receiver.url("/all"))  # a later delivery: the earlier is done
    wait("the test", lambda: len(receiver.at("/all")) >= 2)
    assert [b["type"] for b in verified(receiver.at("/all"))] == [
        "capacity.exhausted",
        "webhook.test",
    ]
    assert receiver.at("/parked-only") == []


def test_a_key_that_spends_its_budget_is_announced(
    node: RunningNode, receiver: Receiver, secret_file: Path
) -> None:
    url = receiver.url("/budget")
    add(node, url, secret_file, "key.budget_exhausted")
    made = node.cli(
        "auth", "key", "create", "metered", "--budget", "40", "--budget-period", "day", "--json"
    )
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["key"]
    statuses: list[int] = []
    while len(statuses) < 10 and (not statuses or statuses[-1] == 200):
        asked = httpx.post(
            node.url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        )
        statuses.append(asked.status_code)
    assert statuses[-1] == 429, statuses
    wait("the budget's event", lambda: receiver.at("/budget"))
    [body] = verified(receiver.at("/budget"))
    assert body["type"] == "key.budget_exhausted"
    assert body["data"] == {  # never the key itself
        "key": "metered",
        "budget_tokens": 40,
        "period": "day",
        "period_start": body["data"]["period_start"],  # type: ignore[index]
    }


def test_a_project_that_spends_its_budget_is_announced_as_the_project(
    node: RunningNode, receiver: Receiver, secret_file: Path
) -> None:
    """Two members' keys share their project's budget: when they have spent
    it together, one event names the project (not a key, not twice)."""
    from letsinfer.authority import people

    url = receiver.url("/project")
    add(node, url, secret_file, "project.budget_exhausted,key.budget_exhausted")
    made = node.cli("project", "create", "shared", "--budget", "40", "--budget-period", "day")
    assert made.returncode == 0, made.stderr
    home = Home.resolve(node.home)
    secrets = []
    for name in ("erin", "frank"):
        store = open_authority(home)
        try:
            people.sign_up(store, name, "a long enough password")
        finally:
            store.close()
        approved = node.cli("user", "approve", name, "--project", "shared")
        assert approved.returncode == 0, approved.stderr
        store = open_authority(home)
        try:  # a key as the portal makes one
            secrets.append(people.create_own_key(store, name, "k", ()).secret)
        finally:
            store.close()
    ask_node(home, "POST", "/v1/local/apply", json={})  # as the portal's own refresh
    statuses: list[int] = []
    while len(statuses) < 12 and (not statuses or statuses[-1] == 200):
        asked = httpx.post(
            node.url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {secrets[len(statuses) % 2]}"},
            timeout=60,
        )
        statuses.append(asked.status_code)
    assert statuses[-1] == 429 and statuses.count(200) >= 2, statuses
    wait("the project's event", lambda: receiver.at("/project"))
    time.sleep(1)  # a second round of the watch: still one event
    [body] = verified(receiver.at("/project"))
    assert body["type"] == "project.budget_exhausted"
    assert body["data"] == {
        "project": "shared",
        "budget_tokens": 40,
        "period": "day",
        "period_start": body["data"]["period_start"],  # type: ignore[index]
    }


def test_an_engine_that_dies_makes_its_group_not_ready_then_ready_again(
    node: RunningNode, receiver: Receiver, secret_file: Path
) -> None:
    url = receiver.url("/groups")
    add(node, url, secret_file, "group.not_ready,group.ready")
    [engine] = node.engine_pids()
    os.kill(engine, signal.SIGKILL)
    wait("ready again", lambda: len(receiver.at("/groups")) >= 2)
    bodies = verified(receiver.at("/groups"))
    assert [b["type"] for b in bodies] == ["group.not_ready", "group.ready"]
    assert {b["data"]["model"] for b in bodies} == {"tiny"}  # type: ignore[index]


def test_a_delivery_queued_while_the_endpoint_is_down_survives_a_main_restart(
    tmp_path: Path, secret_file: Path
) -> None:
    down = Receiver(free_port())  # nothing listens there yet
    running = start_node(tmp_path / "home", env=FAST)
    try:
        url = down.url("/later")
        add(running, url, secret_file, "capacity.exhausted")
        refuse_a_load(running.home, "while-down")
        [queued] = wait(
            "a failed attempt",
            lambda: [d for d in deliveries(running, url) if d["attempts"]],  # type: ignore[index]
        )  # type: ignore[misc]
        assert queued["state"] == "pending" and queued["next_try"]
        running.stop()
        down.start()
        running = start_node(tmp_path / "home", env=FAST)
        wait("delivered after the restart", lambda: down.got)
        [body] = verified(down.got)
        assert body["type"] == "capacity.exhausted"
        assert down.got[0].headers["webhook-id"] == queued["id"]
        assert deliveries(running, url)[0]["state"] == "delivered"
    finally:
        running.stop()
        down.stop()


# -- the dispatcher on a store, without a node ----------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home.under(tmp_path / "home")
    init_main(h, config.load(h.config_file), name="site", default_model=False)
    return h


def test_an_audited_event_read_twice_is_queued_once(home: Home) -> None:
    from letsinfer.fetch import FetchPolicy

    store = open_authority(home)
    try:
        store.add_webhook("http://hooks.example/", SECRET, ("*",))
        dispatcher = Dispatcher(store, config.WebhookSettings(), FetchPolicy())
        dispatcher.step()  # the first round: the cursor and the states as they are
        store.append_audit("capacity", "model.load", "denied", target="big")
        dispatcher.step()
        store.set_setting("webhooks.audit_seq", "0")  # read the chain again: no repeat
        dispatcher.step()
        queued = store.list_deliveries("http://hooks.example/")
        assert [d.event for d in queued] == ["capacity.exhausted"]
    finally:
        store.close()


def test_a_removed_node_becomes_its_event_through_the_removal_s_own_audit(home: Home) -> None:
    """The event comes from what `node remove` itself writes in the chain
    (not a record the test makes up), and only a removal that happened: a
    refused one is no event."""
    from letsinfer.authority.removal import RemovalRefused, remove_node
    from letsinfer.fetch import FetchPolicy

    store = open_authority(home)
    try:
        store.add_webhook("http://hooks.example/", SECRET, ("node.removed",))
        store.add_node("c1", "n1", "child", "10.0.0.2:8444", "fp-n1")
        dispatcher = Dispatcher(store, config.WebhookSettings(), FetchPolicy())
        dispatcher.step()  # the first round: history is not news
        with pytest.raises(RemovalRefused):
            remove_node(store, "nobody", actor="cli")
        remove_node(store, "n1", actor="cli")
        dispatcher.step()
        [queued] = store.list_deliveries("http://hooks.example/")
        assert queued.event == "node.removed"
        assert json.loads(queued.body)["data"]["node"] == "n1"
    finally:
        store.close()


def test_watched_states_become_events_once_each_even_across_a_restart(home: Home) -> None:
    """Parked and back, not ready and ready again, a certificate near its
    expiry: one event per change, and a dispatcher started afresh (a main
    restart) neither repeats one nor misses one."""
    from letsinfer.fetch import FetchPolicy

    store = open_authority(home)
    rows: list[dict[str, object]] = []
    store.watched_groups = lambda: [dict(r) for r in rows]  # type: ignore[method-assign]

    def group(state: str, desired: str = "running") -> None:
        rows[:] = [
            {"id": "pg-1", "service": "m", "desired": desired, "state": state,
             "detail": f"now {state}", "node": "site"}
        ]  # fmt: skip

    def fresh() -> Dispatcher:
        return Dispatcher(store, config.WebhookSettings(), FetchPolicy())

    try:
        store.add_webhook("http://hooks.example/", SECRET, ("*",))
        group("ready")
        fresh().watch()  # the first look: what is, is no news
        for state in ("restarting", "restarting", "starting", "ready", "ready"):
            group(state)
            fresh().watch()  # each round by a new dispatcher: all it knows is on disk
        group("restarting")
        fresh().watch()
        group("parked")
        fresh().watch()
        group("starting")
        fresh().watch()
        group("stopped", desired="stopped")
        fresh().watch()
        group("ready")
        fresh().watch()
        for state in ("draining", "starting", "ready"):  # an upgrade in place: planned
            group(state)
            fresh().watch()
        [main] = store.list_nodes()
        with store.transaction():  # its certificate: a day left
            store.record_node_facts(main.id, {}, cert_not_after=time.time() + 86400)
        fresh().watch()
        fresh().watch()
        events = [
            (d.event, json.loads(d.body)["data"].get("state"))
            for d in reversed(store.list_deliveries("http://hooks.example/"))
        ]
        assert events == [
            ("group.not_ready", "restarting"),
            ("group.ready", None),
            ("group.not_ready", "restarting"),
            ("model.parked", None),
            ("model.unparked", None),
            ("certificate.expiring", None),
        ]
    finally:
        store.close()


def test_a_child_that_goes_quiet_is_announced_once(tmp_path: Path) -> None:
    """Where the main ages a child's facts (on its attention clock): the
    child's silence queues one node.stale, however many rounds see it."""
    from letsinfer.authority.factwriter import FactWriter
    from letsinfer.authority.overload import AttentionClock
    from letsinfer.authority.reports import ReportDesk
    from letsinfer.gateway.routing import RoutingTable
    from letsinfer.telemetry.view import ClusterView
    from tests.test_scale import SECRET as ENGINE_SECRET
    from tests.test_scale import _cluster

    store, child = _cluster(tmp_path, others=0)
    store.add_webhook("http://hooks.example/", SECRET, ("node.stale",))
    now = [1000.0]
    clock = AttentionClock(lambda: now[0])
    view = ClusterView(store, min_interval_s=0.0)
    view.load()
    desk = ReportDesk(
        store,
        FactWriter(store, 0.001),
        RoutingTable(clock=clock.now),
        lambda change: change(),
        view,
        ENGINE_SECRET,
        clock,
        heartbeat_interval_s=5.0,
        stale_after_s=20.0,
        proof_ttl_s=30.0,
    )

    async def scenario() -> None:
        desk.round()
        await desk.report(child.peer, child.der, child.envelope(1))
        desk.round()
        assert store.list_deliveries("http://hooks.example/") == []  # fresh: nothing
        now[0] += 30.0  # no facts for longer than stale_after_s
        desk.round()
        desk.round()

    try:
        asyncio.run(scenario())
        [quiet] = store.list_deliveries("http://hooks.example/")
        assert quiet.event == "node.stale"
        assert json.loads(quiet.body)["data"]["node"] == "me"
    finally:
        store.close()
