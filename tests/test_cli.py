"""Day-2 commands, used as an operator would: exit codes, messages, and what changed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from letsinfer.engines.tinymodel import SENTENCE
from letsinfer.identity import NodeIdentity, save_identity
from tests import json_docs
from tests.db_writer import put_back
from tests.nodes import RunningNode, letsinfer, start_node


def store_files(node: RunningNode) -> list[str]:
    return sorted(p.name for p in (node.home / "var" / "models").rglob("*") if p.is_file())


def test_model_add_refuses_a_file_that_is_not_gguf(main_node: RunningNode, tmp_path: Path) -> None:
    before_models = main_node.cli("model", "list", "--json").stdout
    before_files = store_files(main_node)
    audited = len(json.loads(main_node.cli("audit", "list", "--json").stdout))

    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n")
    result = main_node.cli("model", "add", "notes", "--gguf", str(text))
    assert result.returncode == 1
    assert "not a GGUF file" in result.stderr

    missing = main_node.cli("model", "add", "ghost", "--gguf", str(tmp_path / "nope.gguf"))
    assert missing.returncode == 1 and "no such file" in missing.stderr

    assert main_node.cli("model", "list", "--json").stdout == before_models
    assert store_files(main_node) == before_files
    # Refused like the engine's own refusal: audited, named, with the reason.
    records = json.loads(main_node.cli("audit", "list", "--json").stdout)[audited:]
    assert [(r["action"], r["outcome"], r["target"]) for r in records] == [
        ("model.add", "denied", "notes"),
        ("model.add", "denied", "ghost"),
    ]
    assert "not a GGUF file" in records[0]["detail"]
    assert "no such file" in records[1]["detail"]


def test_model_add_refuses_a_truncated_gguf(
    main_node: RunningNode, tiny_gguf: Path, tmp_path: Path
) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 3])
    before = store_files(main_node)
    result = main_node.cli("model", "add", "cut", "--gguf", str(cut))
    assert result.returncode == 1
    assert "corrupt or truncated" in result.stderr
    assert store_files(main_node) == before


def test_model_add_serves_a_users_gguf_with_aliases(
    main_node: RunningNode, tiny_gguf: Path, tmp_path: Path
) -> None:
    own = tmp_path / "my-model.gguf"
    shutil.copyfile(tiny_gguf, own)
    result = main_node.cli("model", "add", "mine", "--gguf", str(own), "--alias", "mine-latest")
    assert result.returncode == 0, result.stderr
    assert "added model mine" in result.stdout

    twice = main_node.cli("model", "add", "mine", "--gguf", str(own))
    assert twice.returncode == 1 and "already exists" in twice.stderr
    for alias, why in (
        ("tiny", "alias 'tiny' cannot be given: model 'tiny' already exists"),
        ("mine-latest", "alias 'mine-latest' cannot be given: the name 'mine-latest' is already"),
    ):
        clash = main_node.cli("model", "add", "other", "--gguf", str(own), "--alias", alias)
        assert clash.returncode == 1 and why in " ".join(clash.stderr.split()), clash.stderr
    folder = main_node.cli("model", "add", "other", "--gguf", str(tmp_path))
    assert folder.returncode == 1 and "a directory, not a GGUF file" in folder.stderr

    models = {m["name"]: m for m in json.loads(main_node.cli("model", "list", "--json").stdout)}
    assert models["mine"]["aliases"] == ["mine-latest"]
    assert len(models["mine"]["sha256"]) == 64

    deadline = time.monotonic() + 60
    while main_node.wait_healthy()["models"] != {"tiny": 1, "mine": 1}:  # type: ignore[comparison-overlap]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    client = main_node.client()
    for name in ("mine", "mine-latest"):
        reply = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == SENTENCE
    assert {m.id for m in client.models.list()} == {"tiny", "mine"}


def test_api_keys_create_restrict_list_and_revoke(main_node: RunningNode) -> None:
    made = main_node.cli("auth", "key", "create", "ci-bot", "--model", "tiny", "--json")
    assert made.returncode == 0, made.stderr
    issued = json.loads(made.stdout)
    assert issued["models"] == ["tiny"] and issued["key"].startswith("li-")

    listed = main_node.cli("auth", "key", "list", "--json").stdout
    assert issued["key"] not in listed  # secrets are never shown again
    assert "ci-bot" in listed

    bad = main_node.cli("auth", "key", "create", "x", "--model", "no-such-model")
    assert bad.returncode == 1 and "does not exist" in bad.stderr

    url = main_node.url + "/v1/chat/completions"
    auth = {"authorization": f"Bearer {issued['key']}"}
    chat = {"messages": [{"role": "user", "content": "hi"}]}

    def post(model: str) -> httpx.Response:
        deadline = time.monotonic() + 10
        while True:  # the gateway picks up new keys within its cache TTL
            r = httpx.post(url, json={**chat, "model": model}, headers=auth, timeout=60)
            if r.status_code != 401 or time.monotonic() > deadline:
                return r
            time.sleep(0.2)

    assert post("tiny").status_code == 200
    # A model outside the allowlist looks exactly like one that does not exist.
    if "mine" in main_node.cli("model", "list", "--json").stdout:
        assert post("mine").status_code == 404

    revoked = main_node.cli("auth", "key", "revoke", "ci-bot")
    assert revoked.returncode == 0, revoked.stderr
    deadline = time.monotonic() + 10
    while (
        httpx.post(url, json={**chat, "model": "tiny"}, headers=auth, timeout=60).status_code != 401
    ):
        assert time.monotonic() < deadline, "a revoked key must stop working"
        time.sleep(0.2)
    again = main_node.cli("auth", "key", "revoke", "ci-bot")
    assert again.returncode == 1 and "no active API key" in again.stderr


def test_audit_chain_verifies_and_names_a_tampered_record(main_node: RunningNode) -> None:
    # its own record past the two it tampers with (alone, the chain holds three)
    made = main_node.cli("auth", "key", "create", "audit-probe", "--json")
    assert made.returncode == 0, made.stderr
    ok = main_node.cli("audit", "verify")
    assert ok.returncode == 0, ok.stderr
    records = json.loads(main_node.cli("audit", "list", "--json").stdout)
    assert {"node.init", "model.add", "auth.key.create"} <= {r["action"] for r in records}
    assert all("li-" not in json.dumps(r) for r in records), "no secrets in the audit chain"

    path = main_node.home / "var" / "authority.db"
    db = sqlite3.connect(path)
    with db:
        saved = db.execute("SELECT * FROM audit WHERE seq IN (2, 3) ORDER BY seq").fetchall()
    try:
        with db:
            db.execute("UPDATE audit SET target = 'someone-else' WHERE seq = 2")
        bad = main_node.cli("audit", "verify")
        assert bad.returncode == 1
        assert "record 2" in bad.stderr and "edited" in bad.stderr
        with db:
            db.execute("UPDATE audit SET target = ? WHERE seq = 2", (records[1]["target"],))
            db.execute("DELETE FROM audit WHERE seq = 3")
        gone = main_node.cli("audit", "verify")
        assert gone.returncode == 1 and "record 4" in gone.stderr
    finally:
        db.close()
        put_back(path, saved)  # the module's main keeps a sound chain for the tests after
    assert main_node.cli("audit", "verify").returncode == 0


def test_main_scope_commands_refuse_elsewhere(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    result = letsinfer(fresh, "model", "list")
    assert result.returncode == 3
    assert "not a letsinfer node yet" in result.stderr
    assert not (fresh / "var" / "authority.db").exists(), "a refused command changes nothing"

    child = tmp_path / "child"
    save_identity(
        child / "etc" / "node.json", NodeIdentity("c1", "n1", "child", main_address="10.9.8.7:8443")
    )
    for args in (
        ["model", "list"],
        ["auth", "key", "create", "k"],
        ["node", "list"],
        ["doctor", "--cluster"],
        ["top", "--once"],
    ):
        refused = letsinfer(child, *args)
        assert refused.returncode == 3, args
        assert "10.9.8.7:8443" in refused.stderr and "main node only" in refused.stderr
    assert "Runs on: main" in letsinfer(child, "model", "add", "--help").stdout

    candidate = tmp_path / "candidate"
    save_identity(candidate / "etc" / "node.json", NodeIdentity.new_candidate("cand"))
    refused = letsinfer(candidate, "model", "list")
    assert refused.returncode == 3
    assert "not enrolled" in refused.stderr and "letsinfer node add" in refused.stderr
    assert "child of the main" not in refused.stderr
    assert letsinfer(child, "status").returncode == 0


@pytest.mark.parametrize(
    ("config", "env", "words"),
    [
        ("[gateway]\nport = 70000\n", {}, "gateway.port"),
        ("[gateway]\nprot = 8000\n", {}, "unknown setting"),
        ("[gateway\n", {}, "invalid configuration"),
        ("", {"LETSINFER_ENGINE__PARALLEL": "lots"}, "engine.parallel"),
        ("[engine]\nkind = 'vllm-on-cpu'\n", {}, "engine.kind"),
        ("[engine]\nport_first = 20500\n", {}, "overlap task ports 20000-20999"),
        (
            "[control]\nheartbeat_interval_s = 12\n",
            {},
            "gateway.fact_max_age_s (10) must be longer than control.heartbeat_interval_s (12)",
        ),
    ],
)
def test_invalid_config_is_refused_at_start(
    tmp_path: Path, config: str, env: dict[str, str], words: str
) -> None:
    home = tmp_path / "home"
    (home / "etc").mkdir(parents=True)
    (home / "etc" / "config.toml").write_text(config)
    result = letsinfer(home, "up", "--host", "127.0.0.1", env=env, timeout=30)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    assert not (home / "etc" / "node.json").exists(), "nothing is initialised on a bad config"


def test_key_refusals_reach_the_audit_chain_without_secrets(main_node: RunningNode) -> None:
    url = main_node.url + "/v1/chat/completions"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(3):
        assert (
            httpx.post(url, json=body, headers={"authorization": "Bearer li-guess"}).status_code
            == 401
        )
    made = json.loads(
        main_node.cli("auth", "key", "create", "narrow", "--model", "tiny", "--json").stdout
    )
    deadline = time.monotonic() + 10
    while True:
        records = json.loads(main_node.cli("audit", "list", "--json").stdout)
        refusals = [r for r in records if r["action"] == "gateway.request"]
        if any("invalid_api_key" in str(r["detail"]) for r in refusals):
            break
        assert time.monotonic() < deadline, "refusals are audited within the refresh interval"
        time.sleep(0.3)
    text = json.dumps(records)
    assert "li-guess" not in text and made["key"] not in text


def test_every_change_made_with_no_node_running_is_anchored(tmp_path: Path) -> None:
    """The CLI writes the authority itself when no node runs: each of those
    writes must sign the audit chain's head too, or a writer of the database
    could cut them away unseen (docs/audit.md)."""
    home = tmp_path / "home"
    assert letsinfer(home, "node", "init", "--main").returncode == 0
    from letsinfer.engines.tinymodel import write_tiny_model

    model = write_tiny_model(tmp_path / "m.gguf")
    for args in (
        ("auth", "key", "create", "ci", "--json"),
        ("auth", "key", "revoke", "ci"),
        ("model", "add", "mine", "--gguf", str(model), "--no-serve"),
        ("model", "stop", "mine"),
        ("model", "start", "mine"),
        ("node", "pause"),
        ("node", "resume"),
        ("model", "remove", "mine"),
        ("node", "cleanup", "--yes"),
    ):
        done = letsinfer(home, *args, timeout=120)
        assert done.returncode == 0, (args, done.stderr)
    verified = letsinfer(home, "audit", "verify")
    assert verified.returncode == 0, verified.stderr
    assert "not anchored" not in verified.stdout, verified.stdout
    actions = {r["action"] for r in json.loads(letsinfer(home, "audit", "list", "--json").stdout)}
    assert {"auth.key.create", "model.add", "model.remove", "node.cleanup"} <= actions, actions


def test_every_listing_prints_json_as_docs_json_md_documents_it(
    main_node: RunningNode, tmp_path: Path
) -> None:
    """Each listing's --json, on a node where every listing has something to list,
    against docs/json.md; and to a pipe, tables print whole values."""
    client = main_node.client()
    client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Request-Id": "json-schema-1"},
    )
    made = main_node.cli("auth", "key", "create", "schema-bot", "--json")
    assert made.returncode == 0, made.stderr
    assert main_node.cli("auth", "controller", "add", "--role", "viewer").returncode == 0
    artifact = tmp_path / "blob.bin"
    artifact.write_bytes(b"not referenced by anything")
    digest = hashlib.sha256(artifact.read_bytes()).hexdigest()
    added = main_node.cli("mirror", "add", str(artifact), "--sha256", digest)
    assert added.returncode == 0, added.stderr

    def run(command: str) -> object:
        argv = command.replace("NAME", "tiny").replace("ID", "json-schema-1").split()
        deadline = time.monotonic() + 10
        while True:  # request records reach their database about a second later
            result = main_node.cli(*argv)
            waiting = command.startswith("request ") and time.monotonic() < deadline
            if result.returncode != 0 and waiting:
                time.sleep(0.3)  # "no record ... yet": it is on its way
                continue
            assert result.returncode == 0, f"{command}: {result.stderr}"
            data = json.loads(result.stdout)
            if data != [] or time.monotonic() > deadline or command.startswith("node requests"):
                return data
            time.sleep(0.3)

    printed = {}
    for command in json_docs.commands():
        data = run(command)
        json_docs.printed(command, data)
        printed[command] = data
    # Something was checked in each (node requests: a main receives none here;
    # tests/test_trust.py checks a candidate's).
    assert all(printed[c] for c in printed if not c.startswith("node requests"))
    keys = printed["auth key list --json"]
    assert {k["name"]: k["models"] for k in keys}["schema-bot"] == []  # every model
    assert "…" not in json.dumps(printed, ensure_ascii=False)

    # Tables to a pipe: whole digests and ids, nothing cut.
    [model] = [m for m in printed["model list --json"] if m["name"] == "tiny"]
    listing = main_node.cli("model", "list").stdout
    assert model["sha256"] in listing and "…" not in listing
    assert digest in main_node.cli("mirror", "list").stdout


def test_the_node_log_says_each_change_and_refusal_once_and_never_a_secret(
    main_node: RunningNode,
) -> None:
    """A scripted sequence (pause, resume, stop, start, key create, bad keys, a
    streamed request), then what an operator finds in the node's log: one
    line each, the access log with 401s and the stream's token counts,
    counted in metrics too; no key secret, no repeated server start lines."""
    node = main_node
    metrics_url = f"http://127.0.0.1:{node.env['LETSINFER_GATEWAY__METRICS_PORT']}/metrics"

    def refusals() -> float:
        text = httpx.get(metrics_url, timeout=10).text
        line = next(
            (
                x
                for x in text.splitlines()
                if x.startswith('letsinfer_gateway_requests_total{model="-",status="401"}')
            ),
            "x 0",
        )
        return float(line.split()[-1])

    before = refusals()
    # The module's other tests pause and stop too: "once" counts this test's lines.
    start = len(node.log())
    for args in (
        ("node", "pause"),
        ("node", "resume"),
        ("model", "stop", "tiny"),
        ("model", "start", "tiny", "--wait"),
    ):
        done = node.cli(*args)
        assert done.returncode == 0, (args, done.stderr)
    made = json.loads(node.cli("auth", "key", "create", "log-bot", "--json").stdout)
    bad = {"authorization": "Bearer li-not-a-key"}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(node.url + "/v1/chat/completions", json=chat, headers=bad).status_code == 401
    assert httpx.get(node.url + "/v1/models", headers=bad).status_code == 401
    assert refusals() == before + 2
    stream = node.client().chat.completions.create(
        **chat, stream=True, extra_headers={"X-Request-Id": "log-stream-1"}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == SENTENCE

    def audit_line(action: str, target: str) -> str:
        return f"letsinfer.audit: {action} {target} by "

    wanted = [
        audit_line("node.pause", node.banner[0].split("'")[1]),
        audit_line("node.resume", node.banner[0].split("'")[1]),
        audit_line("model.stop", "tiny"),
        audit_line("model.start", "tiny"),
        audit_line("auth.key.create", "log-bot"),
    ]
    deadline = time.monotonic() + 10
    while True:  # the node echoes audit records within a second
        log = node.log()
        streamed = [x for x in log.splitlines() if "request_id=log-stream-1 " in x]
        if (all(w in log for w in wanted) and streamed) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    lines, ours = log.splitlines(), log[start:].splitlines()
    for w in wanted:
        assert sum(w in x for x in ours) == 1, (w, log[start:])
    [line] = streamed
    assert "status=200" in line and "prompt_tokens=-" not in line
    assert "completion_tokens=-" not in line and "completion_tokens=" in line
    refused = [x for x in ours if "letsinfer.access:" in x and "status=401" in x]
    assert any("path=/v1/models" in x for x in refused) and len(refused) >= 2
    # Never a secret: neither a key nor any li- secret, and no noise.
    assert made["key"] not in log and node.key not in log and "li-not-a-key" not in log
    assert "gguf_writer" not in log
    assert sum("Started server process" in x for x in lines) <= 1
    assert sum("gateway: listening on" in x for x in lines) == 1


def test_every_display_shows_a_paused_node_as_the_gateway_treats_it(
    main_node: RunningNode,
) -> None:
    """After `node pause` no display says ready while the gateway answers 503;
    `model start` says starting until the group is ready, `--wait` until then."""
    node = main_node

    def shown() -> dict[str, object]:
        status = json.loads(node.cli("status", "--json").stdout)
        [model] = [
            m for m in json.loads(node.cli("model", "list", "--json").stdout) if m["name"] == "tiny"
        ]
        [main] = json.loads(node.cli("node", "list", "--json").stdout)
        [topo] = json.loads(node.cli("topology", "--json").stdout)
        cluster = json.loads(node.cli("cluster", "status", "--json").stdout)
        show = json.loads(node.cli("model", "show", "tiny", "--json").stdout)
        group = lambda groups: {g["state"] for g in groups if g["model"] == "tiny"}  # noqa: E731
        return {
            "status": (status["state"], status["paused"], group(status["placement_groups"])),
            "model list": (model["state"], model["ready"], group(model["placement_groups"])),
            "model show": (show["state"], group(show["placement_groups"])),
            "node list": main["state"],
            "topology": (topo["state"], group(topo["placement_groups"])),
            "cluster status": group(cluster["nodes"][0]["placement_groups"]),
        }

    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    url, auth = node.url + "/v1/chat/completions", {"authorization": f"Bearer {node.key}"}
    assert node.cli("node", "pause").returncode == 0
    try:
        refused = httpx.post(url, json=chat, headers=auth, timeout=60)
        assert refused.status_code == 503
        assert "on a node an administrator paused" in refused.json()["error"]["message"]
        assert "`letsinfer node resume`" in refused.json()["error"]["message"]
        assert shown() == {
            "status": ("paused", True, {"paused"}),
            "model list": ("paused", 0, {"paused"}),
            "model show": ("paused", {"paused"}),
            "node list": "paused",
            "topology": ("paused", {"paused"}),
            "cluster status": {"paused"},
        }
        text = node.cli("status").stdout
        assert "paused: admits no new requests" in text and "│ ready " not in text
    finally:
        assert node.cli("node", "resume").returncode == 0
    assert shown()["model list"] == ("serving", 1, {"ready"})

    def tasks() -> set[str]:  # a group's tasks say what the group says
        show = json.loads(node.cli("model", "show", "tiny", "--json").stdout)
        return {t["state"] for g in show["placement_groups"] for t in g["tasks"]}

    assert tasks() == {"ready"}
    assert node.cli("model", "stop", "tiny").returncode == 0
    assert shown()["model list"] == ("stopped", 0, {"stopped"})
    assert tasks() == {"stopped"}
    started = node.cli("model", "start", "tiny")
    assert started.returncode == 0, started.stderr
    first = started.stdout.splitlines()[0]
    if first == "model tiny: starting":  # what the gateway says meanwhile
        assert "--wait" in started.stdout
        assert httpx.post(url, json=chat, headers=auth, timeout=60).status_code in (200, 503)
    else:  # it was quick: the state it reports is true already
        assert first == "model tiny: serving", started.stdout
    waited = node.cli("model", "start", "tiny", "--wait")
    assert waited.returncode == 0 and waited.stdout.startswith("model tiny: serving")
    assert tasks() == {"ready"}
    assert httpx.post(url, json=chat, headers=auth, timeout=60).status_code == 200


def test_home_has_one_meaning_shown_and_accepted_alike(tmp_path: Path) -> None:
    from letsinfer.cli import home_first
    from letsinfer.home import Home

    # root's FHS home is shown as /etc/letsinfer, and accepted as that
    assert Home.system().label == "/etc/letsinfer"
    assert Home.resolve("/etc/letsinfer") == Home.system()
    assert Home.resolve(tmp_path / "h").label == str(tmp_path / "h")
    assert home_first(["status", "--home", "D", "--json"]) == ["--home", "D", "status", "--json"]
    assert home_first(["model", "add", "x", "--home=D"]) == ["--home=D", "model", "add", "x"]

    made = tmp_path / "made"
    assert letsinfer(made, "node", "init", "--main").returncode == 0
    shown = json.loads(letsinfer(made, "status", "--json").stdout)["home"]
    after = subprocess.run(
        [sys.executable, "-m", "letsinfer", "status", "--json", "--home", shown],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["initialised"] is True

    nothing = letsinfer(tmp_path / "empty", "status")
    assert nothing.returncode == 3, "asked for a node, there is none"
    assert "no letsinfer node in" in nothing.stdout
    assert letsinfer(tmp_path / "empty", "status", "--json").returncode == 0  # scripts read it

    # a node running in another default home (here: a user's) is named
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    node = start_node(xdg / "letsinfer")
    try:
        pointed = letsinfer(tmp_path / "empty", "status", env={"XDG_DATA_HOME": str(xdg)})
        assert pointed.returncode == 3
        assert f"a node runs in {xdg / 'letsinfer'}" in " ".join(pointed.stdout.split())
    finally:
        node.stop()


@pytest.mark.timeout(90)  # top that writes nothing blocks the read below
def test_top_writes_a_view_per_interval_when_its_output_is_not_a_terminal(
    main_node: RunningNode,
) -> None:
    """`top | tee file` (or a log) gets views while top runs, not only at its end."""
    top = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "letsinfer",
            "--home",
            str(main_node.home),
            "top",
            "--interval",
            "0.3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **main_node.env},
        # Ctrl-C reaches top as a terminal's foreground job: SIGINT as the
        # default, even when the suite itself runs as a background job (which
        # starts with SIGINT ignored, and top rightly keeps that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert top.stdout is not None
    seen: list[str] = []
    try:
        for line in top.stdout:  # blocks until top writes; the suite's timeout bounds it
            seen.append(line)
            if sum("tiny" in s for s in seen) >= 4:  # two views, each naming it twice
                break
        assert top.poll() is None, "views arrive while top runs"
    finally:
        top.send_signal(signal.SIGINT)
        top.communicate(timeout=30)
    assert top.returncode == 0
