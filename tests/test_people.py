"""Accounts and projects on a real main node: an account signed up is pending
and can do nothing until `letsinfer user approve`; every change is audited;
a project's limits cap all its keys together (and cost keys without a
project nothing); a suspended account's keys get 401 on their next request;
an account cannot revoke another's key. (The portal's pages drive the same
authority functions: tests/test_portal.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from letsinfer.audit.anchor import open_authority
from letsinfer.authority import people
from letsinfer.cli.local import ask_node
from letsinfer.home import Home
from letsinfer.store import StoreError
from tests.nodes import RunningNode, start_node

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    running = start_node(tmp_path_factory.mktemp("people") / "home")
    try:
        yield running
    finally:
        running.stop()


def cli_ok(node: RunningNode, *args: str) -> str:
    done = node.cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def sign_up(node: RunningNode, name: str) -> None:
    store = open_authority(Home.resolve(node.home))
    try:
        people.sign_up(store, name, PASSWORD)
    finally:
        store.close()


def own_key(node: RunningNode, owner: str, label: str, *models: str) -> tuple[str, str]:
    """A key as the portal makes one: (its secret, its id)."""
    home = Home.resolve(node.home)
    store = open_authority(home)
    try:
        issued = people.create_own_key(store, owner, label, models)
    finally:
        store.close()
    ask_node(home, "POST", "/v1/local/apply", json={})  # as the portal's own refresh
    return issued.secret, issued.record.id


def chat(node: RunningNode, key: str) -> httpx.Response:
    return httpx.post(
        node.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )


def audit(node: RunningNode, action: str, target: str | None = None) -> list[dict[str, object]]:
    """The audit records of ``action`` (on ``target`` only, where given: the
    module's other tests add records of their own accounts)."""
    records = json.loads(cli_ok(node, "audit", "list", "--json"))
    return [r for r in records if r["action"] == action and target in (None, r["target"])]


def users(node: RunningNode) -> dict[str, dict[str, object]]:
    return {u["name"]: u for u in json.loads(cli_ok(node, "user", "list", "--json"))}


def test_a_signed_up_account_is_pending_until_approved_and_every_change_is_audited(
    node: RunningNode,
) -> None:
    sign_up(node, "carol")
    assert users(node)["carol"]["state"] == "pending"
    with pytest.raises(StoreError, match="not approved"):
        own_key(node, "carol", "early")
    refused = node.cli("user", "approve", "carol", "--project", "nowhere")
    assert refused.returncode != 0 and "no project named 'nowhere'" in refused.stderr
    assert users(node)["carol"]["state"] == "pending"  # nothing half-changed
    cli_ok(node, "project", "create", "study", "--model", "tiny", "--rpm", "100")
    cli_ok(node, "user", "approve", "carol", "--project", "study")
    cli_ok(node, "user", "grant", "carol", "operator")
    shown = users(node)["carol"]
    assert (shown["state"], shown["project"], shown["operator"]) == ("active", "study", True)
    assert [r["outcome"] for r in audit(node, "user.approve", "carol")] == ["denied", "ok"]
    assert [r["target"] for r in audit(node, "user.signup", "carol")] == ["carol"]
    assert audit(node, "project.create")[-1]["target"] == "study"
    assert audit(node, "user.grant")[-1]["detail"] == "operator"
    project = json.loads(cli_ok(node, "project", "show", "study", "--json"))
    assert project["members"] == ["carol"] and project["rpm"] == 100
    # Its password is nowhere in the chain.
    assert PASSWORD not in cli_ok(node, "audit", "list", "--json")


def test_a_projects_limits_cap_all_its_keys_together(node: RunningNode) -> None:
    cli_ok(node, "project", "create", "capped", "--rpm", "2")
    for name in ("alice", "bob"):
        sign_up(node, name)
        cli_ok(node, "user", "approve", name, "--project", "capped")
    alice, _ = own_key(node, "alice", "one")
    bob, _ = own_key(node, "bob", "one")
    assert chat(node, alice).status_code == 200
    assert chat(node, bob).status_code == 200
    third = chat(node, alice)  # each key made one request; together, the project's two
    assert third.status_code == 429, third.text
    assert "Project 'capped' reached its limit of 2 requests" in third.json()["error"]["message"]
    assert int(third.headers["retry-after"]) >= 1
    assert node.key is not None
    assert chat(node, node.key).status_code == 200  # a key without a project: unaffected
    # Lifted on the CLI: its keys follow at once.
    cli_ok(node, "project", "limits", "capped", "--rpm", "off")
    assert chat(node, alice).status_code == 200


def test_a_key_may_only_use_its_projects_models(node: RunningNode) -> None:
    cli_ok(node, "project", "create", "narrow", "--model", "tiny")
    sign_up(node, "dave")
    cli_ok(node, "user", "approve", "dave", "--project", "narrow")
    with pytest.raises(StoreError, match="not a model of project narrow: other"):
        own_key(node, "dave", "wide", "other")
    key, _ = own_key(node, "dave", "fine")
    assert chat(node, key).status_code == 200
    # The project's models narrowed later bound the keys made before.
    cli_ok(node, "model", "list")  # (the only model served here is tiny)
    refused = node.cli("project", "limits", "narrow", "--model", "nothing-such")
    assert refused.returncode != 0 and "does not exist" in refused.stderr


def test_a_suspended_accounts_key_is_refused_on_its_next_request(node: RunningNode) -> None:
    cli_ok(node, "project", "create", "open")
    sign_up(node, "erin")
    cli_ok(node, "user", "approve", "erin", "--project", "open")
    key, _ = own_key(node, "erin", "k")
    assert chat(node, key).status_code == 200
    cli_ok(node, "user", "suspend", "erin")
    assert chat(node, key).status_code == 401
    cli_ok(node, "user", "approve", "erin", "--project", "open")  # reinstated
    assert chat(node, key).status_code == 200
    cli_ok(node, "user", "remove", "erin")
    assert chat(node, key).status_code == 401
    assert "erin" not in users(node)


def test_an_account_cannot_revoke_another_accounts_key(node: RunningNode) -> None:
    cli_ok(node, "project", "create", "pair")
    for name in ("frank", "grace"):
        sign_up(node, name)
        cli_ok(node, "user", "approve", name, "--project", "pair")
    grace_key, grace_id = own_key(node, "grace", "mine")
    store = open_authority(Home.resolve(node.home))
    try:
        with pytest.raises(StoreError, match="no such key of yours"):
            people.revoke_own_key(store, "frank", grace_id)
        assert [k.id for k in store.keys_of("grace")] == [grace_id]
        people.revoke_own_key(store, "grace", grace_id)
    finally:
        store.close()
    ask_node(Home.resolve(node.home), "POST", "/v1/local/apply", json={})
    assert chat(node, grace_key).status_code == 401


def test_a_project_with_members_or_keys_is_not_removed(node: RunningNode) -> None:
    cli_ok(node, "project", "create", "held")
    sign_up(node, "heidi")
    cli_ok(node, "user", "approve", "heidi", "--project", "held")
    refused = node.cli("project", "remove", "held")
    assert refused.returncode != 0 and "has members" in refused.stderr
    cli_ok(node, "user", "remove", "heidi")
    cli_ok(node, "project", "remove", "held")
    assert "held" not in cli_ok(node, "project", "list", "--json")


def test_a_projects_spent_budget_stays_spent_after_a_restart(tmp_path: Path) -> None:
    running = start_node(tmp_path / "home")
    try:
        cli_ok(running, "project", "create", "metered", "--budget", "60", "--budget-period", "day")
        for name in ("ivan", "judy"):
            sign_up(running, name)
            cli_ok(running, "user", "approve", name, "--project", "metered")
        ivan, _ = own_key(running, "ivan", "k")
        judy, _ = own_key(running, "judy", "k")
        statuses: list[int] = []
        while len(statuses) < 10 and (not statuses or statuses[-1] == 200):
            statuses.append(chat(running, (ivan, judy)[len(statuses) % 2]).status_code)
        assert statuses[-1] == 429 and statuses.count(200) >= 2, statuses
    finally:
        running.stop()
    running = start_node(tmp_path / "home")
    try:
        for key in (ivan, judy):
            refused = chat(running, key)
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert error["code"] == "budget_exhausted"
            assert "project 'metered'" in error["message"].lower()
            assert "budget of 60 tokens this day" in error["message"]
    finally:
        running.stop()
