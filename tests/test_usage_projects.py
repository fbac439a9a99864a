"""Projects in the request records, on a real main node: `letsinfer usage --by
project` sums each project's keys (a revoked key's too, and a key's name taken
again in another project counts there from then on), a workstation's prints the
same, and a project's budget spent by a key revoked since stays spent after the
main restarts."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from letsinfer.audit.anchor import open_authority
from letsinfer.authority import people
from letsinfer.authority.apikeys import create_key
from letsinfer.cli.local import ask_node
from letsinfer.home import Home
from letsinfer.store.requests import RequestRecord, RequestStore
from tests import json_docs
from tests.admin_desk import Desk
from tests.nodes import RunningNode, start_node

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    running = start_node(tmp_path_factory.mktemp("usage-projects") / "home")
    try:
        yield running
    finally:
        running.stop()


def cli_ok(node: RunningNode, *args: str) -> str:
    done = node.cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def member(node: RunningNode, name: str, project: str) -> None:
    """An account approved in ``project`` (moved there, if it was in another)."""
    store = open_authority(Home.resolve(node.home))
    try:
        if store.get_account(name) is None:
            people.sign_up(store, name, PASSWORD)
    finally:
        store.close()
    cli_ok(node, "user", "approve", name, "--project", project)


def own_key(node: RunningNode, owner: str, label: str) -> tuple[str, str]:
    """A key as the portal makes one: (its secret, its id)."""
    home = Home.resolve(node.home)
    store = open_authority(home)
    try:
        issued = people.create_own_key(store, owner, label, ())
    finally:
        store.close()
    ask_node(home, "POST", "/v1/local/apply", json={})  # as the portal's own refresh
    return issued.secret, issued.record.id


def revoke_own_key(node: RunningNode, owner: str, key_id: str) -> None:
    home = Home.resolve(node.home)
    store = open_authority(home)
    try:
        people.revoke_own_key(store, owner, key_id)
    finally:
        store.close()
    ask_node(home, "POST", "/v1/local/apply", json={})


def chat(node: RunningNode, key: str) -> httpx.Response:
    return httpx.post(
        node.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )


def answered(node: RunningNode, key: str) -> tuple[int, int]:
    """One chat that must succeed: its (prompt, completion) tokens."""
    reply = chat(node, key)
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    return usage["prompt_tokens"], usage["completion_tokens"]


def test_usage_by_project_sums_each_projects_keys_revoked_ones_too(node: RunningNode) -> None:
    cli_ok(node, "project", "create", "north")
    cli_ok(node, "project", "create", "south")
    member(node, "alice", "north")
    member(node, "bob", "south")
    want: dict[str, list[tuple[int, int]]] = {"north": [], "south": [], "-": []}
    first, first_id = own_key(node, "alice", "k")
    want["north"] += [answered(node, first), answered(node, first)]
    revoke_own_key(node, "alice", first_id)
    # alice moves to south and makes a key of the same label: the same name,
    # "alice--k", now south's. Its requests are south's; the revoked key's
    # stay north's.
    member(node, "alice", "south")
    second, _ = own_key(node, "alice", "k")
    want["south"].append(answered(node, second))
    bob, _ = own_key(node, "bob", "k")
    want["south"].append(answered(node, bob))
    assert node.key is not None
    want["-"].append(answered(node, node.key))  # the node's own key is in no project

    def by_project() -> dict[str, dict[str, int]]:
        rows = json.loads(cli_ok(node, "usage", "--by", "project", "--json"))
        return {r["project"]: r for r in rows}

    counts = {project: len(answers) for project, answers in want.items()}
    deadline = time.monotonic() + 15  # (records are written about a second after the answer)
    while {p: r["requests"] for p, r in by_project().items()} != counts:
        assert time.monotonic() < deadline, by_project()
        time.sleep(0.2)
    rows = by_project()
    json_docs.printed("usage --by project --json", list(rows.values()))  # as docs/json.md says
    for project, answers in want.items():
        prompt = sum(p for p, _ in answers)
        completion = sum(c for _, c in answers)
        got = rows[project]
        assert (got["prompt_tokens"], got["completion_tokens"]) == (prompt, completion), project
        assert got["total_tokens"] == prompt + completion and got["errors"] == 0
    # The same sums as comma-separated values, under a "project" column.
    table = csv.DictReader(io.StringIO(cli_ok(node, "usage", "--by", "project", "--csv")))
    assert {r["project"]: int(r["requests"]) for r in table} == counts


def test_a_projects_budget_spent_by_a_key_revoked_since_stays_spent_after_a_restart(
    tmp_path: Path,
) -> None:
    running = start_node(tmp_path / "home")
    try:
        cli_ok(running, "project", "create", "metered", "--budget", "60", "--budget-period", "day")
        member(running, "ivan", "metered")
        member(running, "judy", "metered")
        spender, spender_id = own_key(running, "ivan", "k")
        judy, _ = own_key(running, "judy", "k")
        statuses: list[int] = []
        while len(statuses) < 10 and (not statuses or statuses[-1] == 200):
            statuses.append(chat(running, spender).status_code)
        assert statuses[-1] == 429 and statuses.count(200) >= 2, statuses
        # ivan's key goes: what it spent is still the project's this day.
        revoke_own_key(running, "ivan", spender_id)
        assert chat(running, judy).status_code == 429
    finally:
        running.stop()
    running = start_node(tmp_path / "home")
    try:
        refused = chat(running, judy)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "budget_exhausted"
        # (what ivan's revoked key spent: before, judy's key was served)
        assert "project 'metered'" in error["message"].lower()
        assert "budget of 60 tokens this day" in error["message"]
    finally:
        running.stop()


def test_usage_by_project_from_a_workstation_is_what_the_main_prints(desk: Desk) -> None:
    store = desk.main.store
    store.add_project("north", (), {})
    create_key(store, "in-north", project="north")
    create_key(store, "nowhere")
    records = RequestStore(desk.main.home.requests_database)
    try:
        now = time.time()
        made = [("r1", "in-north"), ("r2", "in-north"), ("r3", "nowhere")]
        records.insert_many(
            [
                RequestRecord(
                    now, rid, key, "tiny", None, None, "chat", False, 200, 5, 3, None, 9, 0
                )
                for rid, key in made
            ]
        )
    finally:
        records.close()
    remote = desk.at_ws("watcher", "usage", "--by", "project", "--json")
    assert remote.code == 0, remote.err
    assert ("watcher", "GET", "/v1/ops/usage?by=project") in desk.sent
    rows = {r["project"]: r["requests"] for r in json.loads(remote.out)}
    assert rows == {"north": 2, "-": 1}
    local = desk.at_main("usage", "--by", "project", "--json")
    assert (remote.code, remote.out) == (local.code, local.out)
