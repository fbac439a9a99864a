"""The bundle role serving a verified bundle's models on the main: its import
tasks, run by ansible-playbook against this machine, with a stand-in
`letsinfer` that answers like a main and records what the role asked of it.

The stand-in keeps the test fast and off the lab; what `model pull` does with
what the role passes it is tested for real in tests/test_model_pull.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BUNDLE_ID = "0123456789abcdef"
COMMIT = "c0ffee" + "0" * 34

FAKE_LETSINFER = """#!{python}
import hashlib, json, sys
from pathlib import Path

state = Path({state!r})
args = sys.argv[1:]
if args[:1] == ["--home"]:
    args = args[2:]
models = json.loads(state.read_text())
with (state.parent / "calls.jsonl").open("a") as log:
    log.write(json.dumps(args) + "\\n")
if args == ["mirror", "list", "--bundles", "--json"]:
    print(json.dumps([{{"id": {bundle!r}, "removed_files": []}}]))
elif args == ["model", "list", "--json"]:
    print(json.dumps(models))
elif args[:2] == ["model", "add"]:
    digest = hashlib.sha256(Path(args[4]).read_bytes()).hexdigest()
    models.append({{"name": args[2], "aliases": [], "sha256": digest, "repo": None}})
elif args[:2] == ["model", "pull"]:
    opt = {{a: args[i + 1] for i, a in enumerate(args) if a.startswith("--")}}
    models.append(
        {{"name": opt["--name"], "aliases": [], "sha256": "e" * 64, "repo": args[2],
          "revision": opt["--revision"], "commit": opt["--revision"],
          "files": [{{"name": opt["--file"]}}]}}
    )
else:
    sys.exit("unexpected: " + " ".join(args))
state.write_text(json.dumps(models))
"""

PLAYBOOK = """
- name: Serve a verified bundle's models
  hosts: letsinfer_main
  gather_facts: false
  tasks:
    - name: What the role's main tasks note about the verified bundle
      ansible.builtin.set_fact:
        bundle_verified: "{{ verified }}"
        bundle_host_file: /nonexistent/site.tar
    - name: Import and serve it
      ansible.builtin.include_role:
        name: letsinfer.cluster.bundle
        tasks_from: import
"""


GGUF = b"GGUF bytes of the bundle's tiny"
FILE_MODEL = {
    "name": "tiny",
    "path": "models/tiny.gguf",
    "sha256": hashlib.sha256(GGUF).hexdigest(),
    "source": None,
}
HUB_MODEL = {
    "name": "org/tiny-gguf:tiny-gguf-Q8_0",
    "path": f"models/org_tiny-gguf/{COMMIT[:12]}/tiny-gguf-Q8_0.gguf",
    "sha256": hashlib.sha256(GGUF).hexdigest(),
    "source": {
        "repo": "org/tiny-gguf",
        "revision": "main",
        "commit": COMMIT,
        "file": "tiny-gguf-Q8_0.gguf",
    },
}


class Site:
    def __init__(self, root: Path, serving: list[dict[str, Any]]) -> None:
        self.root = root
        self.home = root / "home"
        self.state = root / "models.json"
        self.state.write_text(json.dumps(serving))
        self.executable = root / "letsinfer"
        self.executable.write_text(
            FAKE_LETSINFER.format(python=sys.executable, state=str(self.state), bundle=BUNDLE_ID)
        )
        self.executable.chmod(0o755)
        # The imported bundle's files, where the role finds them.
        for model in (FILE_MODEL, HUB_MODEL):
            path = self.home / "var" / "mirror" / "bundles" / BUNDLE_ID / str(model["path"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(GGUF)
        (root / "playbook.yml").write_text(PLAYBOOK)
        (root / "hosts.yml").write_text(
            "all:\n  children:\n    letsinfer_main:\n      hosts:\n        main:\n"
            "          ansible_connection: local\n"
            f"          ansible_python_interpreter: {sys.executable}\n"
        )

    def play(self, models: list[dict[str, Any]], *args: str) -> subprocess.CompletedProcess[str]:
        verified = {"bundle": BUNDLE_ID, "models": models}
        extra = {
            "verified": verified,
            "bundle_executable": str(self.executable),
            "bundle_home": str(self.home),
        }
        return subprocess.run(
            [
                str(BIN / "ansible-playbook"),
                "-i",
                str(self.root / "hosts.yml"),
                str(self.root / "playbook.yml"),
                "-e",
                json.dumps(extra),
                *args,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=180,
            env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
        )

    def calls(self, verb: str) -> list[list[str]]:
        log = self.root / "calls.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        return [c for c in map(json.loads, lines) if c[:2] == ["model", verb]]


def changed_models(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [
        line.split("(item=", 1)[1].rstrip(")")
        for line in result.stdout.splitlines()
        if line.startswith("changed: [main] => (item=")
    ]


@pytest.mark.timeout(300)
def test_a_bundle_model_named_like_one_the_main_serves_is_refused_saying_which(
    tmp_path: Path,
) -> None:
    # A new main serves its built-in tiny model; the bundle brings another "tiny".
    site = Site(tmp_path, [{"name": "tiny", "aliases": [], "sha256": "a" * 64, "repo": None}])

    result = site.play([FILE_MODEL])

    assert result.returncode != 0, result.stdout
    assert f"model 'tiny' already exists and serves sha256 {'a' * 64}" in result.stdout
    assert FILE_MODEL["sha256"] in result.stdout
    assert site.calls("add") == []


@pytest.mark.timeout(300)
def test_a_bundle_s_hub_model_is_pulled_with_its_provenance_and_a_file_model_added(
    tmp_path: Path,
) -> None:
    site = Site(tmp_path, [])
    predicted = site.play([FILE_MODEL, HUB_MODEL], "--check")
    assert predicted.returncode == 0, predicted.stdout + predicted.stderr
    assert changed_models(predicted) == ["tiny", "org/tiny-gguf:tiny-gguf-Q8_0"]
    assert site.calls("add") == site.calls("pull") == []

    first = site.play([FILE_MODEL, HUB_MODEL])

    assert first.returncode == 0, first.stdout + first.stderr
    gguf = str(site.home / "var" / "mirror" / "bundles" / BUNDLE_ID / "models" / "tiny.gguf")
    assert site.calls("add") == [["model", "add", "tiny", "--gguf", gguf]]
    assert site.calls("pull") == [
        [
            "model",
            "pull",
            "org/tiny-gguf",
            "--file",
            "tiny-gguf-Q8_0.gguf",
            "--revision",
            COMMIT,
            "--name",
            "org/tiny-gguf:tiny-gguf-Q8_0",
        ]
    ]
    assert changed_models(first) == ["tiny", "org/tiny-gguf:tiny-gguf-Q8_0"]

    again = site.play([FILE_MODEL, HUB_MODEL])

    assert again.returncode == 0, again.stdout + again.stderr
    assert changed_models(again) == []
    assert "changed=0" in again.stdout.rsplit("PLAY RECAP", 1)[1]
    assert len(site.calls("add")) == len(site.calls("pull")) == 1
