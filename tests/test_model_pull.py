"""Real models in one command, as an operator uses it: `model pull` from a hub, a
dropped connection, bytes that do not match, a model too big for a GPU, and an
air-gapped host that pulls the same model from an imported bundle.

The hub is a local server speaking the part of the Hugging Face Hub API that
huggingface_hub uses (tests/hubserver.py), on 127.0.0.1. Nothing here contacts
huggingface.co: every node is pointed at the local hub, and huggingface_hub's
own default endpoint is a closed local port.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from letsinfer.engines.tinymodel import SENTENCE, write_tiny_model
from letsinfer.release.keys import generate
from tests.hubserver import FakeHub
from tests.netlab import NetLab, can_make_namespaces
from tests.nodes import RunningNode, letsinfer, start_node

TOKEN = "hf_test_0123456789abcdefghij"
SMALL_GPU = "GPU-fake-small"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The repository's files: the tiny model at Q8_0 and F16, and at F32 as a split
    GGUF of three parts (plus the same F32 model unsplit, to compare a join with)."""
    folder = tmp_path_factory.mktemp("repo")
    files = {
        f"tiny-gguf-{w}.gguf": write_tiny_model(folder / f"tiny-gguf-{w}.gguf", w)
        for w in ("Q8_0", "F16")
    }
    write_tiny_model(folder / "tiny-gguf-F32.gguf", split_max_tensors=8)
    files.update({p.name: p for p in sorted(folder.glob("tiny-gguf-F32-*-of-*.gguf"))})
    assert len(files) == 5
    files["whole-F32"] = write_tiny_model(tmp_path_factory.mktemp("whole") / "whole.gguf")
    return files


@pytest.fixture(scope="module")
def hub(published: dict[str, Path]) -> Iterator[FakeHub]:
    server = FakeHub(token=TOKEN).start()
    repo = {name: path for name, path in published.items() if name.endswith(".gguf")}
    server.add_repo("org/tiny-gguf", {**repo, "README.md": b"# tiny-gguf\n"})
    server.add_repo("org/tampered", {"tampered-Q8_0.gguf": published["tiny-gguf-Q8_0.gguf"]})
    server.corrupt.add("tampered-Q8_0.gguf")
    try:
        yield server
    finally:
        server.stop()


def hub_env(hub: FakeHub, root: Path) -> dict[str, str]:
    token_file = root / "hub-token"
    token_file.write_text(TOKEN + "\n")
    return {
        "LETSINFER_HUB__ENDPOINT": hub.url,
        "LETSINFER_HUB__TOKEN_FILE": str(token_file),
        # The hub is on loopback: a site lists the networks its hub and mirrors use.
        "LETSINFER_FETCH__ALLOW_NETWORKS": "127.0.0.0/8",
        # huggingface_hub's own default endpoint: a closed local port, never the internet.
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HOME": str(root / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, hub: FakeHub) -> Iterator[RunningNode]:
    """One main node for the module: it reaches the hub, and its one (fake) GPU has
    16 MiB free of 8 GiB."""
    root = tmp_path_factory.mktemp("pull")
    gpus = root / "gpus.json"
    gpus.write_text(
        json.dumps(
            [{"uuid": SMALL_GPU, "name": "Fake", "memory_total": 8 << 30, "memory_free": 16 << 20}]
        )
    )
    env = {**hub_env(hub, root), "LETSINFER_HARDWARE__FAKE_GPUS": str(gpus)}
    running = start_node(root / "home", env=env)
    try:
        yield running
    finally:
        running.stop()


def shown(node: RunningNode, name: str) -> dict[str, object]:
    result = node.cli("model", "show", name, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def ok(result: object) -> str:
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"  # type: ignore[attr-defined]
    return result.stdout  # type: ignore[attr-defined,no-any-return]


def test_pull_by_quant_is_served_with_repo_commit_and_sha256(
    node: RunningNode, hub: FakeHub, published: dict[str, Path]
) -> None:
    commit = hub.repos["org/tiny-gguf"].commit
    q8 = published["tiny-gguf-Q8_0.gguf"]
    # The main's one GPU has no room: served on its CPU, as asked.
    result = node.cli("model", "pull", "org/tiny-gguf", "--quant", "Q8_0", "--target", "cpu")
    out = ok(result)
    assert commit in out and sha256_of(q8) in out

    info = shown(node, "org/tiny-gguf:Q8_0")
    assert (info["repo"], info["revision"], info["commit"]) == ("org/tiny-gguf", "main", commit)
    assert info["sha256"] == sha256_of(q8)
    assert info["files"] == [
        {"name": "tiny-gguf-Q8_0.gguf", "sha256": sha256_of(q8), "size": q8.stat().st_size}
    ]
    listed = {m["name"]: m for m in json.loads(ok(node.cli("model", "list", "--json")))}
    assert listed["org/tiny-gguf:Q8_0"]["commit"] == commit

    # Served through the gateway under the name it was pulled as.
    deadline = time.monotonic() + 90
    while True:
        r = httpx.post(
            node.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {node.key}"},
            json={"model": "org/tiny-gguf:Q8_0", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == SENTENCE

    # The token from [hub] token_file reached the hub, and nowhere else.
    assert {s.authorization for s in hub.seen} == {f"Bearer {TOKEN}"}
    audit = ok(node.cli("audit", "list", "--json"))
    for text in (result.stdout, result.stderr, audit, node.log()):
        assert TOKEN not in text

    again = node.cli("model", "pull", "org/tiny-gguf", "--quant", "Q8_0")
    assert "nothing changed" in ok(again)


def test_a_dropped_connection_resumes_where_it_stopped(
    node: RunningNode, hub: FakeHub, published: dict[str, Path]
) -> None:
    f16 = published["tiny-gguf-F16.gguf"]
    earlier = len(hub.gets(f16.name))  # (a bundle another test made fetched it too)
    hub.drop_once.add("tiny-gguf-F16.gguf")
    ok(node.cli("model", "pull", "org/tiny-gguf", "--quant", "F16", "--no-serve"))
    gets = hub.gets("tiny-gguf-F16.gguf")[earlier:]
    assert [g.range for g in gets] == [None, f"bytes={f16.stat().st_size // 2}-"]
    assert shown(node, "org/tiny-gguf:F16")["sha256"] == sha256_of(f16)
    assert not list((node.home / "var" / "downloads").glob("*.part"))


def test_an_interrupted_pull_resumes_its_partial_file_and_joins_a_split(
    node: RunningNode, hub: FakeHub, published: dict[str, Path]
) -> None:
    part1 = published["tiny-gguf-F32-00001-of-00003.gguf"]
    half = part1.stat().st_size // 2
    downloads = node.home / "var" / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    # What a pull stopped midway (Ctrl-C, a lost link) leaves behind.
    (downloads / f"{sha256_of(part1)}.part").write_bytes(part1.read_bytes()[:half])
    earlier = len(hub.gets(part1.name))  # (a bundle another test made fetched it too)

    ok(node.cli("model", "pull", "org/tiny-gguf", "--quant", "F32", "--no-serve"))
    assert [g.range for g in hub.gets(part1.name)[earlier:]] == [f"bytes={half}-"]
    info = shown(node, "org/tiny-gguf:F32")
    assert [f["name"] for f in info["files"]] == [  # type: ignore[union-attr]
        f"tiny-gguf-F32-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]
    # The parts joined are byte for byte the model before it was split.
    assert info["sha256"] == sha256_of(published["whole-F32"])


def test_bytes_that_do_not_match_the_published_sha256_are_refused(
    node: RunningNode, hub: FakeHub
) -> None:
    store = node.home / "var" / "models" / "sha256"
    before = sorted(p.name for p in store.iterdir())
    result = node.cli("model", "pull", "org/tampered")
    assert result.returncode == 1
    assert "tampered-Q8_0.gguf: the bytes received have sha256" in result.stderr
    assert "refused, and the download removed" in result.stderr
    assert sorted(p.name for p in store.iterdir()) == before
    assert not list((node.home / "var" / "downloads").glob("*.part"))
    names = [m["name"] for m in json.loads(ok(node.cli("model", "list", "--json")))]
    assert not any(n.startswith("org/tampered") for n in names)
    audit = json.loads(ok(node.cli("audit", "list", "--json")))
    assert any(a["action"] == "model.pull" and a["outcome"] == "denied" for a in audit)


def test_too_big_for_gpu_memory_plan_says_why_and_install_refuses(node: RunningNode) -> None:
    ok(node.cli("model", "pull", "org/tiny-gguf", "--quant", "Q8_0", "--name", "big", "--no-serve"))

    plan = {r["node"]: r for r in json.loads(ok(node.cli("model", "plan", "big", "--json")))}
    main = plan["main"] if "main" in plan else next(iter(plan.values()))
    assert main["fits"] is False
    assert "does not fit: needs" in main["reason"]
    assert "KV cache" in main["reason"] and f"{SMALL_GPU} has 16.0 MiB free" in main["reason"]

    on_cpu = json.loads(ok(node.cli("model", "plan", "big", "--target", "cpu", "--json")))
    assert on_cpu[0]["fits"] is True
    assert on_cpu[0]["release"].startswith("llama.cpp-xllamacpp-")
    assert on_cpu[0]["needs"]["kv_cache"] > 0

    refused = node.cli("model", "install", "big", "--node", main["node"], "--yes")
    assert refused.returncode == 1
    error = " ".join(refused.stderr.split())
    assert main["reason"] in error and error.endswith("nothing changed")
    assert shown(node, "big")["placement_groups"] == []


def test_pull_and_add_place_with_the_planner_and_refuse_what_fits_nowhere(
    node: RunningNode, published: dict[str, Path]
) -> None:
    # auto on a main with a GPU means that GPU, as `model install` plans it: too small.
    refused = node.cli("model", "pull", "org/tiny-gguf", "--quant", "Q8_0", "--name", "gpu-first")
    assert refused.returncode == 1, refused.stdout
    error = " ".join(refused.stderr.split())
    assert "no node can take model 'gpu-first'" in error and "does not fit: needs" in error
    assert f"{SMALL_GPU} has 16.0 MiB free" in error and error.endswith("Nothing changed.")
    names = [m["name"] for m in json.loads(ok(node.cli("model", "list", "--json")))]
    assert "gpu-first" not in names
    audit = json.loads(ok(node.cli("audit", "list", "--json")))
    assert any(
        r["action"] == "model.add" and r["outcome"] == "denied" and r["target"] == "gpu-first"
        for r in audit
    )

    # `model add` asks the same planner: a node it names that is not there is skipped.
    q8 = published["tiny-gguf-Q8_0.gguf"]
    ghost = node.cli("model", "add", "ghost-node", "--gguf", str(q8), "--node", "nowhere")
    assert ghost.returncode == 1
    assert "nowhere: no such node" in " ".join(ghost.stderr.split())
    placed = ok(node.cli("model", "add", "on-cpu", "--gguf", str(q8), "--target", "cpu"))
    assert "llama.cpp-xllamacpp-" in placed and "-cpu" in placed
    [group] = shown(node, "on-cpu")["placement_groups"]  # type: ignore[misc]
    assert group["gpus"] == []
    both = node.cli("model", "add", "x", "--gguf", str(q8), "--no-serve", "--target", "cpu")
    assert both.returncode == 2 and "--no-serve does not" in both.stderr


def test_mirror_add_verifies_length_and_checksum_before_it_lists_anything(
    tmp_path: Path, published: dict[str, Path]
) -> None:
    home = tmp_path / "site"
    q8, f16 = published["tiny-gguf-Q8_0.gguf"], published["tiny-gguf-F16.gguf"]
    wrong = letsinfer(home, "mirror", "add", str(q8), "--sha256", "0" * 64)
    assert wrong.returncode == 1 and "nothing added" in wrong.stderr
    assert not list((home / "var" / "mirror").glob("sha256/*"))
    ok(letsinfer(home, "mirror", "add", str(q8), "--sha256", sha256_of(q8)))

    public = FakeHub().start()  # a plain web server would do: one file at a URL
    try:
        public.add_repo("org/public", {f16.name: f16})
        url = f"{public.url}/org/public/resolve/main/{f16.name}"
        lan = {"LETSINFER_FETCH__ALLOW_NETWORKS": "127.0.0.1/32"}  # where the server is
        refused = letsinfer(home, "mirror", "add", url, "--sha256", "1" * 64, env=lan)
        assert refused.returncode == 1 and f"its sha256 is {sha256_of(f16)}" in refused.stderr
        ok(letsinfer(home, "mirror", "add", url, "--sha256", sha256_of(f16), env=lan))
    finally:
        public.stop()
    listed = json.loads(ok(letsinfer(home, "mirror", "list", "--json")))
    assert sorted((a["digest"], a["names"][0]) for a in listed) == sorted(
        [(sha256_of(q8), q8.name), (sha256_of(f16), f16.name)]
    )
    leftovers = [p.name for p in (home / "var" / "mirror").iterdir() if p.name.startswith(".")]
    assert leftovers == []


@pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")
def test_a_host_with_no_route_to_the_hub_pulls_from_an_imported_bundle(
    tmp_path: Path, hub: FakeHub, published: dict[str, Path]
) -> None:
    key = tmp_path / "site-key"
    public = generate(key).text
    # The connected side: a bundle of the repository at its main branch.
    builder = tmp_path / "builder"
    env = hub_env(hub, tmp_path)
    bundle = tmp_path / "models.tar"
    made = letsinfer(
        builder,
        "bundle",
        "create",
        "--out",
        str(bundle),
        "--key",
        str(key),
        "--no-wheels",
        "--model",
        "org/tiny-gguf@main",
        env=env,
    )
    ok(made)

    # The air-gapped side: a namespace with no route to the hub (it listens in
    # the root namespace), configured exactly like the connected main.
    lab = NetLab(["airgap"]).up()
    try:
        home = tmp_path / "airgap"
        (home / "etc").mkdir(parents=True, mode=0o700)
        (home / "etc" / "config.toml").write_text(f'[release]\ntrusted_keys = ["{public}"]\n')

        def airgap(*args: str) -> subprocess.CompletedProcess[str]:
            cmd = (sys.executable, "-m", "letsinfer", "--home", str(home), *args)
            return lab.run("airgap", *cmd, env=env, timeout=120)

        def run(*args: str) -> str:
            return ok(airgap(*args))

        run("node", "init", "--main", "--name", "airgap")
        run("bundle", "import", str(bundle))
        seen = len(hub.seen)

        # A mirror file rewritten after its import is refused, not admitted.
        f16 = published["tiny-gguf-F16.gguf"]
        blob = home / "var" / "mirror" / "sha256" / sha256_of(f16)
        blob.write_bytes(bytes(b ^ 1 for b in blob.read_bytes()))
        tampered = airgap("model", "pull", "org/tiny-gguf", "--quant", "F16")
        assert tampered.returncode == 1
        assert "it was changed after import); refused" in tampered.stderr
        # The very command the connected main ran.
        result = airgap("model", "pull", "org/tiny-gguf", "--quant", "Q8_0")
        ok(result)
        assert "hub not used" in result.stderr and "mirror" in result.stderr
        assert len(hub.seen) == seen  # nothing reached the hub
        info = json.loads(run("model", "show", "org/tiny-gguf:Q8_0", "--json"))
        assert info["repo"] == "org/tiny-gguf"
        assert info["commit"] == hub.repos["org/tiny-gguf"].commit
        assert info["sha256"] == sha256_of(published["tiny-gguf-Q8_0.gguf"])
    finally:
        lab.down()


def test_a_bundled_hub_model_is_pulled_from_the_mirror_as_the_bundle_role_serves_it(
    tmp_path: Path, hub: FakeHub, published: dict[str, Path]
) -> None:
    key = tmp_path / "site-key"
    public = generate(key).text
    bundle = tmp_path / "models.tar"
    made = letsinfer(
        tmp_path / "builder",
        "bundle",
        "create",
        "--out",
        str(bundle),
        "--key",
        str(key),
        "--no-wheels",
        "--model",
        "org/tiny-gguf@main:Q8_0",
        env=hub_env(hub, tmp_path),
    )
    ok(made)
    # The workstation's verify tells the bundle role what each model is.
    verify = ("bundle", "verify", str(bundle), "--key", public, "--json")
    [model] = json.loads(ok(letsinfer(tmp_path / "workstation", *verify)))["models"]
    commit = hub.repos["org/tiny-gguf"].commit
    assert model["name"] == "org/tiny-gguf:tiny-gguf-Q8_0"
    assert model["sha256"] == sha256_of(published["tiny-gguf-Q8_0.gguf"])
    source = model["source"]
    assert source == {
        "repo": "org/tiny-gguf",
        "revision": "main",
        "commit": commit,
        "file": "tiny-gguf-Q8_0.gguf",
    }

    # An air-gapped main with the hub off (node_hub_enabled: false writes this).
    home = tmp_path / "airgap"
    (home / "etc").mkdir(parents=True, mode=0o700)
    (home / "etc" / "config.toml").write_text(
        f'[release]\ntrusted_keys = ["{public}"]\n\n[hub]\nenabled = false\n'
    )
    ok(letsinfer(home, "node", "init", "--main", "--name", "airgap"))
    ok(letsinfer(home, "bundle", "import", str(bundle)))
    seen = len(hub.seen)
    # What the role runs (letsinfer_model with repo, revision and file).
    pulled = letsinfer(
        home,
        "model",
        "pull",
        source["repo"],
        "--file",
        source["file"],
        "--revision",
        source["commit"],
        "--name",
        model["name"],
        "--no-serve",
    )

    ok(pulled)
    assert "hub not used" in pulled.stderr and "the hub is off" in pulled.stderr
    assert len(hub.seen) == seen
    info = json.loads(ok(letsinfer(home, "model", "show", model["name"], "--json")))
    assert (info["repo"], info["commit"], info["sha256"]) == (
        "org/tiny-gguf",
        commit,
        model["sha256"],
    )
