"""Day-2 lifecycle on one main node, used as an operator would: proof at the
door, parking, replacement before removal, model removal, /health, names with
a slash, and what a model add killed midway leaves behind."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from letsinfer.engines.tinymodel import SENTENCE, write_tiny_model
from tests.nodes import RunningNode, free_port, letsinfer, processes_using, start_node

ROOT = Path(__file__).resolve().parent.parent
CHAT = [{"role": "user", "content": "hi"}]


@dataclass
class Lab:
    node: RunningNode
    root: Path
    broken: Path  # a llama-server binary that never starts
    flag: Path  # while it exists, the working llama-server fails to start too
    killed_partials: list[Path]  # left by a `model add` killed midway
    metrics: int

    def chat(self, model: str) -> httpx.Response:
        return httpx.post(
            self.node.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {self.node.key}"},
            json={"model": model, "messages": CHAT},
            timeout=60,
        )

    def group(self, model: str) -> dict[str, object]:
        shown = self.node.cli("model", "show", model, "--json")
        assert shown.returncode == 0, shown.stderr
        show = json.loads(shown.stdout)
        [pg] = show["placement_groups"]
        return pg  # type: ignore[no-any-return]

    def wait_state(self, model: str, state: str, timeout: float = 90) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while (pg := self.group(model))["state"] != state:
            assert time.monotonic() < deadline, f"{model} not {state}: {pg}\n{self.node.log()}"
            time.sleep(0.2)
        return pg


FLAKY = "org/flaky"  # a name with a slash, through the running node's admin socket


def add_flaky(lab: Lab) -> subprocess.CompletedProcess[str]:
    source = write_tiny_model(lab.root / "flaky.gguf", name="flaky")
    return lab.node.cli("model", "add", FLAKY, "--gguf", str(source), "--engine", "llama-server")


def given_flaky_serving(lab: Lab) -> dict[str, object]:
    """The flaky model added (a test before may have added it) and its group ready."""
    if lab.node.cli("model", "show", FLAKY, "--json").returncode != 0:
        added = add_flaky(lab)
        assert added.returncode == 0, added.stderr
    return lab.wait_state(FLAKY, "ready")


def given_no_flaky(lab: Lab) -> None:
    """No flaky model (a test before may have added it)."""
    if lab.node.cli("model", "show", FLAKY, "--json").returncode == 0:
        removed = lab.node.cli("model", "remove", FLAKY, "--stop")
        assert removed.returncode == 0, removed.stderr


def shim(path: Path, *, broken: bool = False) -> Path:
    fail = "LLAMA_SHIM_FAIL=1 " if broken else ""
    path.write_text(
        f'#!/bin/sh\n{fail}exec {sys.executable} {ROOT / "tests/llama_server_shim.py"} "$@"\n'
    )
    path.chmod(0o755)
    return path


def store_files(home: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (home / "var/models").rglob("*")
        if p.is_file()
    }


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("lifecycle")
    home = root / "home"
    metrics = free_port()
    env = {
        "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(shim(root / "llama-server")),
        "LLAMA_SHIM_FAIL_WHILE": str(root / "fail.flag"),
        "LETSINFER_AGENT__PARK_AFTER_FAILED_STARTS": "2",
        "LETSINFER_AGENT__RESTART_BACKOFF_INITIAL_S": "0.2",
        "LETSINFER_ENGINE__THREADS": "1",
    }
    init = letsinfer(home, "node", "init", "--main", "--name", "main", env=env)
    assert init.returncode == 0, init.stderr
    key = init.stdout.split("API key (shown once): ")[1].split()[0]

    # A `model add` killed while its trial engine loads the file: the partial
    # copy and the trial's folder beside it stay in the store until the node
    # starts; the trial engine dies with it.
    source = write_tiny_model(root / "killed.gguf", name="killed")
    cli = [sys.executable, "-m", "letsinfer", "--home", str(home)]
    temp = Path(tempfile.gettempdir())
    temp_before = set(temp.iterdir())
    adding = subprocess.Popen(
        [*cli, "model", "add", "killed", "--gguf", str(source)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = home / "var/models/sha256"
    deadline = time.monotonic() + 60
    while not (copies := [p for p in store.glob(".import-*.part") if p.is_file()]) or not (
        processes_using(copies[0])
    ):
        assert adding.poll() is None and time.monotonic() < deadline, "no trial engine seen"
        time.sleep(0.05)
    adding.send_signal(signal.SIGKILL)
    adding.wait()
    partials = list(store.glob(".import-*"))
    assert copies[0] in partials and any(p.is_dir() for p in partials), partials
    assert not [p for p in set(temp.iterdir()) - temp_before if "door" in p.name]

    node = start_node(home, env={**env, "LETSINFER_GATEWAY__METRICS_PORT": str(metrics)})
    node.key = key
    try:
        yield Lab(
            node,
            root,
            shim(root / "llama-server-broken", broken=True),
            root / "fail.flag",
            partials,
            metrics,
        )
    finally:
        node.stop()


def test_a_model_add_killed_midway_leaves_nothing_once_the_node_starts(lab: Lab) -> None:
    assert lab.killed_partials and not any(p.exists() for p in lab.killed_partials)
    assert not list((lab.node.home / "var/models/sha256").glob(".import-*"))
    assert "a model import killed midway left it" in lab.node.log()
    assert processes_using(lab.killed_partials[0]) == [], "the trial engine died with its CLI"
    models = {m["name"] for m in json.loads(lab.node.cli("model", "list", "--json").stdout)}
    assert "killed" not in models


def test_model_add_refuses_a_gguf_no_engine_can_load(lab: Lab) -> None:
    home = lab.node.home
    unknown = write_tiny_model(lab.root / "unknown.gguf", architecture="frobnicator")
    files, models = store_files(home), lab.node.cli("model", "list", "--json").stdout
    audit = json.loads(lab.node.cli("audit", "list", "--json").stdout)

    refused = lab.node.cli("model", "add", "frob", "--gguf", str(unknown))
    assert refused.returncode == 1
    # The engine's own words, and the promise.
    assert "unknown model architecture: 'frobnicator'" in refused.stderr, refused.stderr
    assert "Nothing changed" in refused.stderr
    assert store_files(home) == files, "the store is byte-identical"
    assert lab.node.cli("model", "list", "--json").stdout == models
    after = json.loads(lab.node.cli("audit", "list", "--json").stdout)
    [new] = after[len(audit) :]
    assert (new["action"], new["target"], new["outcome"]) == ("model.add", "frob", "denied")
    assert processes_using(home / "var/models/sha256/.import-") == [], "no trial engine left"


def test_a_group_failing_to_start_is_parked_and_model_start_unparks_it(lab: Lab) -> None:
    node, model = lab.node, FLAKY
    given_no_flaky(lab)  # its subject starts at the add (its first start: generation 0)
    added = add_flaky(lab)
    assert added.returncode == 0, added.stderr
    lab.wait_state(model, "ready")
    assert lab.chat(model).json()["choices"][0]["message"]["content"] == SENTENCE
    assert (
        httpx.get(
            f"{node.url}/v1/models/{model}", headers={"authorization": f"Bearer {node.key}"}
        ).json()["id"]
        == model
    )

    assert node.cli("model", "stop", model).returncode == 0
    stopped = lab.chat(model)
    assert stopped.status_code == 503 and stopped.json()["error"]["code"] == "model_stopped"
    assert "retry-after" not in stopped.headers
    assert httpx.get(node.url + "/health").status_code == 200, "a stopped model is not a failure"

    lab.flag.touch()  # from now on its engine fails to start, as a broken build would
    try:
        assert node.cli("model", "start", model).returncode == 0
        pg = lab.wait_state(model, "parked")
        reason = str(pg["detail"])
        assert "2 failed starts" in reason and "shim broken on purpose" in reason, reason

        refused = lab.chat(model)  # at once: no retry for ever
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "model_parked" and "retry-after" not in refused.headers
        assert "shim broken on purpose" in error["message"]
        assert f"letsinfer model start {model}" in error["message"]

        # A parked model does not take the gateway out of a load balancer.
        assert httpx.get(node.url + "/health").json() == {"status": "ok"}
        keyed = httpx.get(
            node.url + "/health", headers={"authorization": f"Bearer {node.key}"}
        ).json()
        assert keyed["states"][model] == "parked" and keyed["status"] == "ok"
        status = json.loads(node.cli("status", "--json").stdout)
        [mine] = [g for g in status["placement_groups"] if g["model"] == model]
        assert mine["state"] == "parked" and "shim broken on purpose" in mine["detail"]
        [topo] = json.loads(node.cli("topology", "--json").stdout)
        [there] = [g for g in topo["placement_groups"] if g["model"] == model]
        assert there["state"] == "parked" and "shim broken on purpose" in there["detail"]
        metrics = httpx.get(f"http://127.0.0.1:{lab.metrics}/metrics").text
        [line] = [
            m for m in metrics.splitlines() if m.startswith("letsinfer_placement_group_parked{")
        ]
        assert (
            f'model="{model}"' in line
            and "shim broken on purpose" in line
            and line.endswith(" 1.0")
        )
    finally:
        lab.flag.unlink()

    started = node.cli("model", "start", model)  # unparks: its engine starts afresh
    assert started.returncode == 0, started.stderr
    pg = lab.wait_state(model, "ready")
    assert pg["generation"] == 1
    assert lab.chat(model).status_code == 200
    assert node.cli("model", "resume", model).returncode == 0
    audit = json.loads(node.cli("audit", "list", "--json").stdout)
    starts = [r for r in audit if r["action"] == "model.start" and r["target"] == model]
    assert str(pg["id"]) in str(starts[-1]["detail"]) and "unparked" in str(starts[-1]["detail"])


def test_replacing_with_a_failing_group_keeps_the_old_one_serving(lab: Lab) -> None:
    node, model = lab.node, FLAKY
    before = given_flaky_serving(lab)
    statuses: list[int] = []
    done = threading.Event()

    def client() -> None:
        while not done.is_set():
            statuses.append(lab.chat(model).status_code)

    worker = threading.Thread(target=client)
    worker.start()
    try:
        replaced = letsinfer(
            node.home,
            *("model", "install", model, "--node", "main", "--engine", "llama-server"),
            *("--replace-existing", "--yes"),
            env={**node.env, "LETSINFER_ENGINE__LLAMA_SERVER_BINARY": str(lab.broken)},
            timeout=180,
        )
    finally:
        done.set()
        worker.join()
    assert replaced.returncode == 1, replaced.stdout + replaced.stderr
    assert f"{before['id']} on main failed" in replaced.stderr, replaced.stderr
    assert "restored" in replaced.stdout
    after = lab.group(model)
    assert (after["id"], after["release"], after["pid"], after["state"]) == (
        before["id"],
        before["release"],
        before["pid"],
        "ready",
    )
    assert statuses and set(statuses) == {200}, statuses
    audit = json.loads(node.cli("audit", "list", "--json").stdout)
    assert [r["outcome"] for r in audit if r["action"] == "model.install"][-1] == "failed"


def test_model_remove_is_refused_while_it_runs_and_frees_its_file(lab: Lab) -> None:
    node = lab.node
    source = write_tiny_model(lab.root / "solo.gguf", name="solo")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    stored = node.home / "var/models/sha256" / f"{digest}.gguf"
    assert node.cli("model", "add", "solo", "--gguf", str(source)).returncode == 0
    lab.wait_state("solo", "ready")
    engine = processes_using(stored)
    assert engine

    refused = node.cli("model", "remove", "solo")
    assert refused.returncode == 1 and "--stop" in refused.stderr
    assert "Nothing changed" in refused.stderr
    assert stored.exists() and lab.chat("solo").status_code == 200

    removed = node.cli("model", "remove", "solo", "--stop")
    assert removed.returncode == 0, removed.stderr
    assert "freed" in removed.stdout
    assert not stored.exists()
    assert lab.chat("solo").status_code == 404
    deadline = time.monotonic() + 30
    while processes_using(stored):
        assert time.monotonic() < deadline, "its engine must stop"
        time.sleep(0.1)

    # Bytes another model uses stay; a model that is only registered never
    # fails /health.
    tiny = write_tiny_model(lab.root / "tiny-again.gguf")
    assert node.cli("model", "add", "twin", "--gguf", str(tiny), "--no-serve").returncode == 0
    assert httpx.get(node.url + "/health").status_code == 200
    twin = node.cli("model", "remove", "twin")
    assert twin.returncode == 0 and "used by tiny" in twin.stdout
    assert lab.chat("tiny").status_code == 200


def test_a_release_written_into_the_database_without_the_release_key_never_runs(
    lab: Lab,
) -> None:
    """Someone who can write the authority (the letsinfer group) but holds no
    release key adds a release of their own binary, even into the model's
    history: neither an upgrade nor a rollback runs it, and nothing changes."""
    import sqlite3

    node, model = lab.node, FLAKY
    before = given_flaky_serving(lab)
    db = sqlite3.connect(node.home / "var/authority.db")
    [signature] = db.execute(
        "SELECT signature FROM runtime_releases WHERE id = ?", (before["release"],)
    ).fetchone()
    with db:
        db.execute(
            "INSERT INTO runtime_releases(id, engine, version, target, artifacts, launch, "
            "signature, created_at) VALUES ('evil', 'llama-server', '1', 'cpu', '{}', ?, ?, 0)",
            (json.dumps({"binary": str(lab.broken)}), signature),  # another release's signature
        )
        db.execute(
            "INSERT INTO release_history(service, node_id, pg_id, release_id, event, at) "
            "SELECT service, node_id, id, 'evil', 'installed', 0 FROM placement_groups "
            "WHERE id = ?",
            (before["id"],),
        )
    db.close()
    for args in (("upgrade", model, "--release", "evil"), ("rollback", model, "--to", "evil")):
        refused = node.cli("model", *args)
        assert refused.returncode == 1, refused.stdout
        assert "release evil cannot run" in refused.stderr and "Nothing changed" in refused.stderr
    after = lab.group(model)
    assert [after[k] for k in ("id", "release", "pid")] == [
        before[k] for k in ("id", "release", "pid")
    ]
    assert lab.chat(model).status_code == 200
