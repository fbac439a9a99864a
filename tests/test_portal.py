"""The portal under /ui/ on a real main node, attacked over HTTP (httpx):
a form from another origin without its token, a planted session id, 50 wrong
passwords, an unknown account against a wrong password, markup in names,
another account's key, a signed-out session cookie. Each is refused with
nothing changed. (The browser's walk through the pages:
tests/test_portal_browser.py.)"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
from starlette.testclient import TestClient

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority import people
from letsinfer.authority.bootstrap import init_main
from letsinfer.config import PortalSettings
from letsinfer.engines.tinymodel import write_tiny_model
from letsinfer.gateway.gateway import Gateway
from letsinfer.home import Home
from letsinfer.portal.pages import Portal
from letsinfer.portal.sessions import digest, new_id
from tests.nodes import RunningNode, start_node
from tests.test_lifecycle import shim

PASSWORD = "correct horse battery staple"
# [portal] signin_window_s here: longer than ten wrong tries take (an argon2id
# check each: over a second on 2 busy cores), short for the test
WINDOW_S = 20
FAILURES = 10
FAIL_FLAG = "fail.flag"  # beside the node's home


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    root = tmp_path_factory.mktemp("portal")
    env = {
        "LETSINFER_PORTAL__SIGNIN_WINDOW_S": str(WINDOW_S),
        "LETSINFER_PORTAL__SIGNIN_FAILURES": str(FAILURES),
        # A model on llama-server (the test shim) that fails to start while
        # FAIL_FLAG exists, parked after two tries: the operator page's parked group.
        "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(shim(root / "llama-server")),
        "LLAMA_SHIM_FAIL_WHILE": str(root / FAIL_FLAG),
        "LETSINFER_AGENT__PARK_AFTER_FAILED_STARTS": "2",
        "LETSINFER_AGENT__RESTART_BACKOFF_INITIAL_S": "0.2",
    }
    running = start_node(root / "home", env=env)
    try:
        yield running
    finally:
        running.stop()


def cli_ok(node: RunningNode, *args: str) -> str:
    done = node.cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def browser(node: RunningNode) -> httpx.Client:
    return httpx.Client(base_url=node.url, timeout=30, follow_redirects=False)


def token(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def sign_up(node: RunningNode, name: str, project: str | None = "everyone") -> None:
    with browser(node) as b:
        made = b.post(
            "/ui/signup",
            data={"csrf": token(b.get("/ui/signup")), "name": name, "password": PASSWORD},
        )
        assert made.status_code == 201, made.text
    if project is not None:
        if project not in cli_ok(node, "project", "list", "--json"):
            cli_ok(node, "project", "create", project)
        cli_ok(node, "user", "approve", name, "--project", project)


def signed_in(node: RunningNode, name: str, password: str = PASSWORD) -> httpx.Client:
    b = browser(node)
    answer = b.post(
        "/ui/signin",
        data={"csrf": token(b.get("/ui/signin")), "name": name, "password": password},
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/keys", answer.text
    return b


def create_key(b: httpx.Client, label: str) -> tuple[str, str]:
    """(its secret, its id) as the keys page shows them."""
    made = b.post("/ui/keys", data={"csrf": token(b.get("/ui/keys")), "label": label})
    assert made.status_code == 201, made.text
    secret = re.search(r'<output id="secret">([^<]+)</output>', made.text)
    assert secret
    ids = re.findall(r'action="/ui/keys/([0-9a-f]+)/revoke"', made.text)
    return secret.group(1), ids[-1]


def chat(node: RunningNode, key: str) -> httpx.Response:
    return httpx.post(
        node.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )


def accounts(node: RunningNode) -> list[str]:
    store = open_authority(Home.resolve(node.home))
    try:
        return [a.name for a in store.list_accounts()]
    finally:
        store.close()


def test_pages_carry_strict_headers(node: RunningNode) -> None:
    page = httpx.get(node.url + "/ui/signin")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src" not in csp  # no script at all
    assert "'unsafe-inline'" not in csp
    assert page.headers["cache-control"] == "no-store"
    assert page.headers["x-frame-options"] == "DENY"
    pre = page.headers["set-cookie"]
    assert "httponly" in pre.lower() and "samesite=strict" in pre.lower()


def test_a_form_from_another_origin_without_the_token_is_refused(node: RunningNode) -> None:
    before = accounts(node)
    forged = httpx.post(
        node.url + "/ui/signup",
        data={"name": "forged", "password": PASSWORD},
        headers={"origin": "http://evil.example"},
    )
    assert forged.status_code == 403
    # With a token from another visitor's session, from this origin: refused too.
    with browser(node) as other:
        stolen = token(other.get("/ui/signup"))
    with browser(node) as b:
        b.get("/ui/signup")
        replayed = b.post(
            "/ui/signup", data={"csrf": stolen, "name": "forged", "password": PASSWORD}
        )
        assert replayed.status_code == 403
    assert accounts(node) == before
    # Signed in: a key-creating form without the session's token changes nothing.
    sign_up(node, "victim")
    b = signed_in(node, "victim")
    made = b.post("/ui/keys", data={"label": "forged"}, headers={"origin": "http://evil.example"})
    assert made.status_code == 403
    assert "forged" not in b.get("/ui/keys").text


def test_a_session_id_planted_before_sign_in_is_replaced(node: RunningNode) -> None:
    sign_up(node, "fixated")
    b = browser(node)
    planted = "attacker-chosen-session-id-0123456789"
    b.cookies.set(SESSION := "li_session", planted, domain="127.0.0.1", path="/ui")
    answer = b.post(
        "/ui/signin",
        data={"csrf": token(b.get("/ui/signin")), "name": "fixated", "password": PASSWORD},
    )
    assert answer.status_code == 303
    issued = answer.cookies.get(SESSION)
    assert issued and issued != planted
    with browser(node) as attacker:
        attacker.cookies.set(SESSION, planted, domain="127.0.0.1", path="/ui")
        assert attacker.get("/ui/keys").headers["location"] == "/ui/signin"


def test_guessing_is_throttled_per_account_and_the_password_works_after_the_window(
    node: RunningNode,
) -> None:
    sign_up(node, "guessed")
    b = browser(node)
    csrf = token(b.get("/ui/signin"))
    statuses = [
        b.post(
            "/ui/signin", data={"csrf": csrf, "name": "guessed", "password": f"guess {n:04}"}
        ).status_code
        for n in range(50)
    ]
    assert statuses[:FAILURES] == [401] * FAILURES
    assert set(statuses[FAILURES:]) == {429}
    throttled = b.post("/ui/signin", data={"csrf": csrf, "name": "guessed", "password": PASSWORD})
    assert throttled.status_code == 429  # even the right one, while the window holds
    retry_after = int(throttled.headers["retry-after"])
    assert 1 <= retry_after <= WINDOW_S
    reopens = time.monotonic() + retry_after  # (when its oldest failure leaves the window)
    # Another account is not throttled by this one's guesses.
    sign_up(node, "bystander")
    signed_in(node, "bystander").close()
    time.sleep(max(0.0, reopens - time.monotonic()) + 0.5)
    signed_in(node, "guessed").close()


def test_an_unknown_account_and_a_wrong_password_get_the_same_bytes(node: RunningNode) -> None:
    sign_up(node, "known")
    b = browser(node)
    csrf = token(b.get("/ui/signin"))
    wrong = b.post("/ui/signin", data={"csrf": csrf, "name": "known", "password": "not it at all"})
    unknown = b.post(
        "/ui/signin", data={"csrf": csrf, "name": "nobody-here", "password": "not it at all"}
    )
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.content == unknown.content

    def headers(r: httpx.Response) -> list[tuple[str, str]]:
        return [(k, v) for k, v in r.headers.multi_items() if k != "date"]

    assert headers(wrong) == headers(unknown)


def test_markup_in_a_name_is_shown_escaped(node: RunningNode) -> None:
    with browser(node) as b:
        refused = b.post(
            "/ui/signup",
            data={
                "csrf": token(b.get("/ui/signup")),
                "name": "<script>alert(1)</script>",
                "password": PASSWORD,
            },
        )
    assert refused.status_code == 400  # not a name; the form comes back with it, escaped
    assert "<script>" not in refused.text
    assert 'value="&lt;script&gt;alert(1)&lt;/script&gt;"' in refused.text
    assert "<script>alert(1)</script>" not in accounts(node)
    sign_up(node, "marked")
    b = signed_in(node, "marked")
    made = b.post(
        "/ui/keys", data={"csrf": token(b.get("/ui/keys")), "label": "<script>alert(1)</script>"}
    )
    assert made.status_code == 400 and "<script>" not in made.text


def test_another_accounts_key_cannot_be_revoked(node: RunningNode) -> None:
    sign_up(node, "owner")
    sign_up(node, "thief")
    owner = signed_in(node, "owner")
    secret, key_id = create_key(owner, "mine")
    thief = signed_in(node, "thief")
    tried = thief.post(f"/ui/keys/{key_id}/revoke", data={"csrf": token(thief.get("/ui/keys"))})
    assert tried.status_code == 404
    assert chat(node, secret).status_code == 200  # still works
    assert key_id in owner.get("/ui/keys").text


def test_a_suspended_accounts_session_and_keys_stop_at_once(node: RunningNode) -> None:
    sign_up(node, "paused")
    b = signed_in(node, "paused")
    secret, _ = create_key(b, "k")
    assert chat(node, secret).status_code == 200
    cli_ok(node, "user", "suspend", "paused")
    assert chat(node, secret).status_code == 401
    assert b.get("/ui/keys").headers["location"] == "/ui/signin"


def test_a_signed_out_session_cookie_no_longer_works(node: RunningNode) -> None:
    sign_up(node, "leaving")
    b = signed_in(node, "leaving")
    cookie = b.cookies.get("li_session")
    assert b.get("/ui/keys").status_code == 200
    out = b.post("/ui/signout", data={"csrf": token(b.get("/ui/keys"))})
    assert out.status_code == 303
    with browser(node) as replay:
        replay.cookies.set("li_session", cookie or "", domain="127.0.0.1", path="/ui")
        assert replay.get("/ui/keys").headers["location"] == "/ui/signin"


def test_a_pending_account_cannot_sign_in(node: RunningNode) -> None:
    sign_up(node, "waiting", project=None)
    b = browser(node)
    answer = b.post(
        "/ui/signin",
        data={"csrf": token(b.get("/ui/signin")), "name": "waiting", "password": PASSWORD},
    )
    assert answer.status_code == 403 and "li_session" not in answer.cookies


def test_the_operator_page_shows_a_parked_group_with_its_reason_to_operators_only(
    tmp_path: Path,
) -> None:
    home = Home.under(tmp_path / "home")
    init_main(home, config.load(home.config_file), name="site", default_model=False)
    store = open_authority(home)
    try:
        main = store.list_nodes()[0]
        store.ensure_release("r1", "llama-server", "1", "cpu", {}, {})
        store.add_service("big", "d" * 64, 1, "gguf", None)
        store.add_placement_group("pg-big", "big", main.id, "r1", "cpu")
        store.record_pg_observation(
            "pg-big", state="parked", detail="failed to start 3 times: <out of memory>"
        )
        store.add_project("ops", (), {})
        sessions = {}
        for name, operator in (("olga", True), ("pete", False)):
            people.sign_up(store, name, PASSWORD)
            people.approve(store, name, "ops")
            if operator:
                people.grant(store, name, "operator")
            sessions[name] = new_id()
            with store.transaction():
                store.add_session(digest(sessions[name]), name, new_id(), 60)
    finally:
        store.close()
    portal = Portal(home, PortalSettings(), cast(Gateway, None), lambda: "http://unused/v1")
    try:
        with TestClient(portal.app, base_url="http://main") as client:
            client.cookies.set("li_session", sessions["olga"])
            page = client.get("/operator")
            assert page.status_code == 200
            row = re.search(r"<tr><td>big</td>.*?</tr>", page.text)
            assert row, page.text
            assert "parked" in row.group(0)
            assert "failed to start 3 times: &lt;out of memory&gt;" in row.group(0)
            client.cookies.set("li_session", sessions["pete"])
            refused = client.get("/operator")
            assert refused.status_code == 403 and "big" not in refused.text
    finally:
        portal.close()


def test_a_parked_group_on_the_running_main_is_on_the_operator_page(node: RunningNode) -> None:
    source = write_tiny_model(node.home.parent / "flaky.gguf", name="flaky")
    cli_ok(node, "model", "add", "flaky", "--gguf", str(source), "--engine", "llama-server")

    def state() -> dict[str, object]:
        [pg] = json.loads(cli_ok(node, "model", "show", "flaky", "--json"))["placement_groups"]
        return pg  # type: ignore[no-any-return]

    def wait(want: str) -> dict[str, object]:
        deadline = time.monotonic() + 90
        while (pg := state())["state"] != want:
            assert time.monotonic() < deadline, f"flaky not {want}: {pg}\n{node.log()}"
            time.sleep(0.2)
        return pg

    wait("ready")
    cli_ok(node, "model", "stop", "flaky")
    (node.home.parent / FAIL_FLAG).touch()  # its engine fails to start from now on
    try:
        cli_ok(node, "model", "start", "flaky")
        reason = str(wait("parked")["detail"])
        assert "2 failed starts" in reason and "shim broken on purpose" in reason, reason
        sign_up(node, "otto")
        cli_ok(node, "user", "grant", "otto", "operator")
        b = signed_in(node, "otto")
        page = b.get("/ui/operator")
        b.close()
        assert page.status_code == 200, page.text
        # It stays current on a wall screen by itself, with no script.
        assert re.search(r'<meta http-equiv="refresh" content="\d+">', page.text), page.text
        assert "<script" not in page.text
        row = re.search(r"<tr><td>flaky</td>.*?</tr>", page.text, re.S)
        assert row, page.text
        assert "parked" in row.group(0) and "2 failed starts" in row.group(0)
        assert "shim broken on purpose" in row.group(0)
    finally:
        (node.home.parent / FAIL_FLAG).unlink()
        cli_ok(node, "model", "stop", "flaky")  # (the module's other tests use tiny only)
