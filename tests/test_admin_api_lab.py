"""One CLI, local or remote, as an operator meets it: a main in a network
namespace and a workstation in another (not a node) paired with it as an
operator, an administrator and a viewer. The same commands typed on the
workstation run on the main over mutual TLS and print what they print on the
main; the viewer is refused operator work before anything is sent, and the
main's audit chain has the refusal."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from letsinfer.engines.tinymodel import write_tiny_model
from tests.cluster import PY, Cluster
from tests.netlab import NetLab, can_make_namespaces

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")

WS = "ws"  # the workstation's home: every pairing lives here, under its own name


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("admin-api")
    lab = NetLab(["main", "ws"]).up()
    c = Cluster(lab, root)
    shim = root / "llama-server"
    shim.write_text(f'#!/bin/sh\nexec {PY} {ROOT / "tests/llama_server_shim.py"} "$@"\n')
    shim.chmod(0o755)
    c.extra_env = {
        "main": {
            "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(shim),
            "LETSINFER_ENGINE__THREADS": "1",
        }
    }
    try:
        out = c.ok("main", "node", "init", "--main", "--name", "main")
        c.key = out.split("API key (shown once): ")[1].split()[0]
        c.up("main")
        for name, role in (("op", "operator"), ("admin", "administrator"), ("look", "viewer")):
            added = c.ok("main", "auth", "controller", "add", "--role", role, "--name", name)
            code = added.split("code: ")[1].split()[0]
            comparison = added.split("comparison: ")[1].split()[0]
            c.ok(
                "ws",
                "controller",
                "pair",
                "--main",
                f"{lab.hosts['main']}:8443",
                "--code",
                code,
                "--expect",
                comparison,
                "--name",
                name,
                home=WS,
            )
        yield c
    finally:
        c.stop()
        lab.down()


def on_ws(c: Cluster, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """A command typed on the workstation."""
    return c.lab.run(
        "ws",
        PY,
        "-m",
        "letsinfer",
        "--home",
        str(c.home(WS)),
        *args,
        env={**c.env("ws"), **(env or {})},
        timeout=timeout,
    )


def model_json(c: Cluster, name: str) -> dict[str, Any]:
    return json.loads(c.ok("main", "model", "show", name, "--json"))  # type: ignore[no-any-return]


def test_the_workstation_lists_and_selects_its_paired_mains(cluster: Cluster) -> None:
    c = cluster
    listed = json.loads(on_ws(c, "controller", "list", "--json").stdout)
    assert {(p["name"], p["role"], p["selected"]) for p in listed} == {
        ("op", "operator", False),
        ("admin", "administrator", False),
        ("look", "viewer", False),
    }
    # Nothing selected: a command scoped to the main is this machine's, and it is no node.
    here = on_ws(c, "usage", "--json")
    assert here.returncode == 3 and "not a letsinfer node" in here.stderr
    assert on_ws(c, "controller", "use", "op").returncode == 0
    assert [p["name"] for p in json.loads(on_ws(c, "controller", "list", "--json").stdout)
            if p["selected"]] == ["op"]  # fmt: skip
    unknown = on_ws(c, "--controller", "nobody", "usage")
    assert unknown.returncode == 1 and "no main paired as 'nobody'" in unknown.stderr
    assert on_ws(c, "controller", "use", "--clear").returncode == 0


def test_remote_commands_print_what_they_print_on_the_main(cluster: Cluster) -> None:
    c = cluster
    assert on_ws(c, "controller", "use", "op").returncode == 0
    try:
        # model upgrade (operator): the main's placement group moves to a new release.
        [before] = model_json(c, "tiny")["placement_groups"]
        c.wait(lambda: model_json(c, "tiny")["placement_groups"][0]["state"] == "ready",
               "tiny ready", timeout=90)  # fmt: skip
        release = c.ok("main", "release", "add", "--llama-server", str(c.root / "llama-server"),
                       "--target", "cpu").split(": ", 1)[1].split()[0]  # fmt: skip
        upgraded = on_ws(c, "model", "upgrade", "tiny", "--release", release, "--json")
        assert upgraded.returncode == 0, upgraded.stderr
        result = json.loads(upgraded.stdout)
        assert [g["outcome"] for g in result["placement_groups"]] == ["upgraded"], result
        [after] = model_json(c, "tiny")["placement_groups"]
        assert after["release"] == release and after["id"] != before["id"]
        assert any(r["action"] == "model.upgrade" and r["actor"] == "controller:op"
                   for r in c.audit("main"))  # fmt: skip
        # The same upgrade again: nothing to do, said alike here and there (JSON and text).
        for extra in (["--json"], []):
            remote = on_ws(c, "model", "upgrade", "tiny", "--release", release, *extra)
            local = c.cli("main", "model", "upgrade", "tiny", "--release", release, *extra,
                          timeout=300)  # fmt: skip
            assert (remote.returncode, remote.stdout) == (local.returncode, local.stdout)

        # auth key create with its options (administrator): --controller overrides `use`.
        options = ["--model", "tiny", "--rpm", "5", "--tpm", "900", "--band", "batch",
                   "--budget", "5000", "--budget-period", "week", "--cache-ttl", "30",
                   "--concurrency", "2", "--json"]  # fmt: skip
        made = on_ws(c, "--controller", "admin", "auth", "key", "create", "remote-k", *options)
        assert made.returncode == 0, made.stderr
        local = json.loads(c.ok("main", "auth", "key", "create", "local-k", *options))
        remote = json.loads(made.stdout)
        secret = str(remote.pop("key"))
        local.pop("key")
        assert {**remote, "name": "local-k"} == local  # the same answer, but for the name
        assert list(remote) == list(local)  # in the same order
        [listed] = [k for k in json.loads(c.ok("main", "auth", "key", "list", "--json"))
                    if k["name"] == "remote-k"]  # fmt: skip
        assert (listed["rpm"], listed["tpm"], listed["band"], listed["concurrency"]) == (
            5, 900, "batch", 2)  # fmt: skip
        assert any(r["action"] == "auth.key.create" and r["actor"] == "controller:admin"
                   for r in c.audit("main"))  # fmt: skip
        # The secret works at the main's gateway.
        request_id = c.py("ws", f"""
import httpx
r = httpx.post("http://{c.lab.hosts['main']}:8000/v1/chat/completions", timeout=60,
               headers={{"authorization": "Bearer {secret}"}},
               json={{"model": "tiny", "messages": [{{"role": "user", "content": "hi"}}]}})
assert r.status_code == 200, r.text
print(r.headers["x-request-id"])
""").strip()  # fmt: skip

        # usage --json (viewer and up), by key and by node: the same JSON.
        def same_usage() -> bool:
            for by in ("key", "node"):
                remote = on_ws(c, "--controller", "look", "usage", "--by", by, "--json")
                local = c.cli("main", "usage", "--by", by, "--json")
                if remote.returncode or remote.stdout != local.stdout:
                    return False
            return True

        c.wait(lambda: "remote-k" in c.ok("main", "usage", "--json"), "the request's record")
        c.wait(same_usage, "the same usage on the workstation and the main")
        table_remote = on_ws(c, "usage").stdout
        assert table_remote == c.ok("main", "usage") and "remote-k" in table_remote

        # request lookup (viewer): the same record, JSON and table; an unknown id alike.
        for extra in (["--json"], []):
            remote = on_ws(c, "--controller", "look", "request", request_id, *extra)
            assert remote.returncode == 0, remote.stderr
            assert remote.stdout == c.ok("main", "request", request_id, *extra)
        unknown = on_ws(c, "request", "no-such-id")
        local = c.cli("main", "request", "no-such-id")
        assert (unknown.returncode, unknown.stderr) == (local.returncode, local.stderr) == (
            1, local.stderr)  # fmt: skip

        # model list and node list (viewer): the same objects, every state alike.
        look = ("--controller", "look")
        assert on_ws(c, *look, "model", "list", "--json").stdout == c.ok(
            "main", "model", "list", "--json")  # fmt: skip
        assert on_ws(c, *look, "model", "list").stdout == c.ok("main", "model", "list")

        for extra in (["--json"], []):
            assert on_ws(c, *look, "model", "show", "tiny", *extra).stdout == c.ok(
                "main", "model", "show", "tiny", *extra)  # fmt: skip
        missing = on_ws(c, *look, "model", "show", "nothing")
        assert (missing.returncode, missing.stderr) == (
            1, c.cli("main", "model", "show", "nothing").stderr)  # fmt: skip

        def nodes(listed: str) -> list[dict[str, Any]]:
            return [{**n, "last_seen": None} for n in json.loads(listed)]  # (it moves)

        assert nodes(on_ws(c, *look, "node", "list", "--all", "--json").stdout) == nodes(
            c.ok("main", "node", "list", "--all", "--json"))  # fmt: skip

        # cluster status (viewer): the same JSON.
        def cluster_json(shown: str) -> dict[str, Any]:
            seen = json.loads(shown)
            return {**seen, "nodes": nodes(json.dumps(seen["nodes"]))}

        assert cluster_json(on_ws(c, *look, "cluster", "status", "--json").stdout) == (
            cluster_json(c.ok("main", "cluster", "status", "--json")))  # fmt: skip

        # model add (operator) of a file already on the main: nothing is uploaded.
        # (Under the main's mirror: a controller may add only from there, its
        # model store or [control] add_from.)
        drop = c.home("main") / "var" / "mirror" / "drop"
        drop.mkdir(parents=True, exist_ok=True)
        on_main = write_tiny_model(drop / "on-main.gguf")
        added = on_ws(c, "model", "add", "from-ws", "--gguf", str(on_main), "--no-serve")
        assert added.returncode == 0, added.stderr
        here = c.ok("main", "model", "add", "from-main", "--gguf", str(on_main), "--no-serve")
        assert added.stdout.replace("from-ws", "from-main") == here
        assert any(r["action"] == "model.add" and r["actor"] == "controller:op"
                   for r in c.audit("main"))  # fmt: skip

        # model scale (operator) and model fallback (administrator): shown, set alike.
        assert on_ws(c, "model", "scale", "tiny", "--json").stdout == c.ok(
            "main", "model", "scale", "tiny", "--json")  # fmt: skip
        scaled = on_ws(c, "model", "scale", "tiny", "--max", "2", "--json")
        assert scaled.returncode == 0, scaled.stderr
        assert json.loads(scaled.stdout)["policy"]["max_groups"] == 2
        assert scaled.stdout == c.ok("main", "model", "scale", "tiny", "--json")
        cleared = on_ws(c, "--controller", "admin", "model", "fallback", "tiny", "--clear")
        assert cleared.returncode == 0, cleared.stderr
        assert cleared.stdout == c.ok("main", "model", "fallback", "tiny", "--clear")

        # auth key list and limits (administrator): listed, shown and changed alike.
        admin = ("--controller", "admin")
        assert on_ws(c, *admin, "auth", "key", "list", "--json").stdout == c.ok(
            "main", "auth", "key", "list", "--json")  # fmt: skip
        changed = on_ws(c, *admin, "auth", "key", "limits", "remote-k", "--rpm", "7", "--json")
        assert changed.returncode == 0, changed.stderr
        shown = c.ok("main", "auth", "key", "limits", "remote-k", "--json")
        assert changed.stdout == shown and json.loads(shown)["rpm"] == 7
        assert on_ws(c, *admin, "auth", "key", "limits", "remote-k").stdout == c.ok(
            "main", "auth", "key", "limits", "remote-k")  # fmt: skip

        # audit verify: the same sentence (the record count may move between the two).
        verified = on_ws(c, "audit", "verify")
        assert verified.returncode == 0, verified.stderr
        assert "audit chain intact" in verified.stdout
        digits = re.compile(r"\d+")
        assert digits.sub("N", verified.stdout) == digits.sub("N", c.ok("main", "audit", "verify"))
    finally:
        on_ws(c, "controller", "use", "--clear")


def test_the_viewer_is_refused_before_sending_and_the_main_audits_it(cluster: Cluster) -> None:
    c = cluster
    before = len(c.audit("main"))
    refused = on_ws(c, "model", "upgrade", "tiny", "--release", "r-none",
                    env={"LETSINFER_CONTROLLER": "look"})  # fmt: skip
    assert refused.returncode == 1
    assert "needs the operator role" in refused.stderr and "was not sent" in refused.stderr
    assert "recorded the refusal" in refused.stderr
    key = on_ws(c, "auth", "key", "create", "nope", "--rpm", "5",
                env={"LETSINFER_CONTROLLER": "op"})  # fmt: skip
    assert key.returncode == 1 and "needs the administrator role" in key.stderr
    records = c.audit("main")[before:]
    denied = {(r["actor"], r["action"]) for r in records if r["outcome"] == "denied"}
    assert denied == {
        ("controller:look", "cli:model upgrade"),
        ("controller:op", "cli:auth key create"),
    }, records
    # Nothing of the operation reached the main: no upgrade, no key.
    assert not any(r["action"] in ("model.upgrade", "auth.key.create") for r in records)
    assert "nope" not in c.ok("main", "auth", "key", "list")

    # A command that never runs from a controller is refused here, nothing sent.
    listed = on_ws(c, "--controller", "admin", "user", "list")
    assert listed.returncode == 3
    assert "never from a controller" in " ".join(listed.stderr.split())
    assert len(c.audit("main")) == len(records) + before

    # `top` from the viewer's workstation: the main's own metrics, read there
    # over its loopback (the workstation could not reach that listener).
    shown = on_ws(c, "--controller", "look", "top", "--once", "--interval", "0.3")
    assert shown.returncode == 0, shown.stderr
    assert "nodes" in shown.stdout and "main" in shown.stdout

    # The API refuses a viewer's raw request itself, and audits it.
    files = c.home(WS) / "etc/controller/mains/look"
    c.py("ws", f"""
import httpx
from letsinfer.trust.peer import client_context
tls = client_context({str(files / 'ca.crt')!r}, {str(files / 'controller.crt')!r},
                     {str(files / 'controller.key')!r})
r = httpx.post("https://{c.lab.hosts['main']}:8443/v1/ops/models/tiny/upgrade",
               json={{"release": "r-none"}}, verify=tls, timeout=30)
assert r.status_code == 403 and "needs the operator role" in r.text, r.text
""")  # fmt: skip
    assert any(
        r["actor"] == "controller:look"
        and r["action"] == "/v1/ops/models/tiny/upgrade"
        and r["outcome"] == "denied"
        for r in c.audit("main")
    )
