"""The local admin socket: the CLI on a machine reaches its own running node
through it, with the kernel's peer credentials deciding who may."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from letsinfer.audit.denials import DenialLog
from letsinfer.control.admin_socket import AdminPlane, Credentials, LocalGate, refusal
from letsinfer.control.ops import ops_router
from letsinfer.control.typed_app import typed_app
from letsinfer.identity import NodeIdentity
from letsinfer.store import AuthorityStore
from tests.nodes import RunningNode, letsinfer

NOBODY = 65534


def chat(node: RunningNode, key: str | None = None) -> httpx.Response:
    return httpx.post(
        f"{node.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key or node.key}"},
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


def test_cli_pauses_the_running_main_through_its_admin_socket(main_node: RunningNode) -> None:
    sock = main_node.home / "run" / "admin.sock"
    mode = sock.stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660

    before = len(json.loads(main_node.cli("audit", "list", "--json").stdout))
    try:
        paused = main_node.cli("node", "pause")
        assert paused.returncode == 0, paused.stderr
        # The node applied it before answering: the very next request is refused.
        assert chat(main_node).status_code == 503
    finally:
        resumed = main_node.cli("node", "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert chat(main_node).status_code == 200

    records = json.loads(main_node.cli("audit", "list", "--json").stdout)[before:]
    mine = [(r["actor"], r["action"]) for r in records if r["action"].startswith("node.")]
    assert mine == [("local:root", "node.pause"), ("local:root", "node.resume")]

    missing = main_node.cli("model", "stop", "no-such-model")
    assert missing.returncode == 1 and "no model 'no-such-model'" in missing.stderr


def test_keys_made_and_revoked_through_the_running_node_apply_at_once(
    main_node: RunningNode,
) -> None:
    made = main_node.cli("auth", "key", "create", "via-socket", "--json")
    assert made.returncode == 0, made.stderr
    secret = json.loads(made.stdout)["key"]
    assert chat(main_node, secret).status_code == 200  # no wait for the key cache

    revoked = main_node.cli("auth", "key", "revoke", "via-socket")
    assert revoked.returncode == 0, revoked.stderr
    assert chat(main_node, secret).status_code == 401  # refused from the moment it returned

    again = main_node.cli("auth", "key", "revoke", "via-socket")
    assert again.returncode == 1 and "no active API key named 'via-socket'" in again.stderr
    records = json.loads(main_node.cli("audit", "list", "--json").stdout)
    mine = [
        (r["actor"], r["role"], r["action"], r["outcome"])
        for r in records
        if r["target"] == "via-socket"
    ]
    assert mine == [
        ("local:root", "administrator", "auth.key.create", "ok"),
        ("local:root", "administrator", "auth.key.revoke", "ok"),
        ("local:root", "administrator", "auth.key.revoke", "denied"),  # every refusal too
    ]


def test_deep_json_on_the_admin_socket_is_a_clean_400(main_node: RunningNode) -> None:
    transport = httpx.HTTPTransport(uds=str(main_node.home / "run" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://node", timeout=30) as client:
        for depth in (65, 900, 5000):  # past the limit, near and past the parser's own
            deep = '{"name": "deep", "models": ' + "[" * depth + "]" * depth + "}"
            reply = client.post(
                "/v1/ops/keys", content=deep, headers={"content-type": "application/json"}
            )
            assert reply.status_code == 400, reply.text
            assert "deeper than 64 levels" in reply.json()["error"]["message"]
    assert "Traceback" not in main_node.log()
    assert "deep" not in main_node.cli("auth", "key", "list").stdout  # nothing made


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory user nobody may enter (pytest's own are root-only)."""
    with tempfile.TemporaryDirectory(prefix="letsinfer-admin-") as d:
        Path(d).chmod(0o755)
        yield Path(d)


def test_peer_credentials_decide_who_may_use_the_socket(open_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    # A directory anyone may enter and a socket anyone may open: only the peer
    # credentials stand between user nobody and the node.
    tmp_path = open_dir
    store = AuthorityStore(tmp_path / "authority.db")
    ident = NodeIdentity(node_id="n-main", name="main", role="main")
    app = typed_app("test admin")
    app.include_router(ops_router(store, ident))
    path = tmp_path / "admin.sock"
    request = "GET /v1/ops/version HTTP/1.1\\r\\nHost: node\\r\\nConnection: close\\r\\n\\r\\n"
    client = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({str(path)!r})\n"
        f"s.sendall(b'{request}')\n"
        "print(b''.join(iter(lambda: s.recv(65536), b'')).decode())\n"
    )

    def as_user(uid: int | None) -> str:
        prefix = (
            [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        )
        done = subprocess.run(
            [*prefix, "/usr/bin/python3", "-c", client], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    denials = DenialLog(store)

    async def scenario() -> tuple[str, str]:
        plane = AdminPlane(path, LocalGate(app, denials, node_uid=os.geteuid()))
        await plane.start()
        try:
            path.chmod(0o666)
            for _ in range(2):
                await asyncio.to_thread(as_user, NOBODY)
            return await asyncio.to_thread(as_user, NOBODY), await asyncio.to_thread(as_user, None)
        finally:
            await plane.stop()

    try:
        nobody, root = asyncio.run(scenario())
        assert nobody.startswith("HTTP/1.1 403")
        assert "is not root, the node's user, or in the 'letsinfer' group" in nobody
        assert root.startswith("HTTP/1.1 200") and '"main":"main"' in root
        assert not path.exists(), "the socket goes away with the node"
        # Refusals are counted, not written one by one: three make one record.
        assert [r for r in store.list_audit() if r.outcome == "denied"] == []
        denials.flush()
        denied = [r for r in store.list_audit() if r.outcome == "denied"]
        assert [(r.actor, r.action, r.count) for r in denied] == [
            ("local:nobody", "admin:request", 3)
        ]
    finally:
        store.close()


def test_refusal_admits_root_the_node_user_and_nobody_else() -> None:
    assert refusal(Credentials(pid=1, uid=0, gid=0), node_uid=1234) is None
    assert refusal(Credentials(pid=-1, uid=1234, gid=1234), node_uid=1234) is None
    why = refusal(Credentials(pid=-1, uid=NOBODY, gid=NOBODY), node_uid=1234, group="no-group")
    assert why is not None and "'no-group' group" in why


def test_a_user_outside_the_group_gets_a_sentence_not_a_traceback(open_dir: Path) -> None:
    """User nobody runs the CLI against root's node: each command says which
    file, whose files they are and which group lets a user in."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the CLI as another user")
    home = open_dir / "home"
    made = letsinfer(home, "node", "init", "--main", "--name", "rootnode")
    assert made.returncode == 0, made.stderr
    home.chmod(0o755)
    for argv in (
        ["status"],
        ["status", "--json"],
        ["model", "list"],
        ["node", "pause"],
        ["auth", "key", "list", "--json"],
        ["up"],
    ):
        done = subprocess.run(
            [
                *("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"),
                *(sys.executable, "-m", "letsinfer", "--home", str(home), *argv),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, (argv, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, (argv, done.stderr)
        assert f"permission denied on {home}/etc/node.json" in done.stderr, (argv, done.stderr)
        assert "'letsinfer' group" in done.stderr and "sudo" in done.stderr, done.stderr
    # Nothing was made or changed by the refused calls.
    assert not (home / "run" / "node.pid").exists()
