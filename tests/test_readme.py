"""The README's two commands are the real ones."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from letsinfer.engines.tinymodel import SENTENCE
from tests.lab import wheelhouse
from tests.nodes import free_port, loopback_env, processes_using

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_ci_runs_the_readme_test_command() -> None:
    _, second = readme_commands()
    assert second in (ROOT / ".ci" / "run").read_text()


def _healthy(port: int, key: str) -> bool:
    try:
        health = httpx.get(
            f"http://127.0.0.1:{port}/health", headers={"authorization": f"Bearer {key}"}
        )
    except httpx.HTTPError:
        return False
    return health.status_code == 200


def test_readme_first_command_brings_up_a_serving_main_node(tmp_path: Path) -> None:
    first, _ = readme_commands()
    port = free_port()
    home = tmp_path / "home"
    # The README's command as is; only the home and the listeners are confined.
    env = {**os.environ, "LETSINFER_HOME": str(home), "PYTHONUNBUFFERED": "1", **loopback_env(port)}
    proc = subprocess.Popen(
        ["bash", "-c", first],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        key = None
        for line in proc.stdout:
            if line.strip().startswith("API key"):
                key = line.split()[2]
            if line.startswith("Ctrl-C"):
                break
        assert key, "the first command must print an API key"
        # The banner comes before the engine has loaded: a person copying the
        # key takes seconds, a loaded machine may take longer still.
        deadline = time.monotonic() + 90
        while not _healthy(port, key):
            assert time.monotonic() < deadline and proc.poll() is None, "never served"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], timeout=60
        )
        assert reply.choices[0].message.content == SENTENCE
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        proc.wait(timeout=60)
    assert processes_using(home) == []


# The machine a new user has, in a private mount and network namespace: their
# /etc, /var/lib and /opt as overlays (tmpfs upper layers) and a fresh /run, so
# `./dev up` as root writes /etc/letsinfer and the rest where a user's would
# go, and the real machine's files and network stay untouched. Lab hosts built
# inside it overlay *this* /etc: they see what this `./dev up` made, unless the
# lab hides it.
_README_MACHINE = """
import json, os, signal, subprocess, sys, time, urllib.request
from pathlib import Path

scratch, first, tests = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
subprocess.run(["mount", "-t", "tmpfs", "machine", str(scratch)], check=True)
for d in ("etc", "var/lib", "opt"):
    (scratch / "upper" / d).mkdir(parents=True)
    (scratch / "work" / d).mkdir(parents=True)
    options = f"lowerdir=/{d},upperdir={scratch}/upper/{d},workdir={scratch}/work/{d}"
    subprocess.run(["mount", "-t", "overlay", "machine", "-o", options, f"/{d}"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "machine-run", "/run"], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

def health():
    try:
        with urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=5) as r:
            return r.status
    except OSError as exc:
        return getattr(exc, "code", None)

# As the README says: root, the default home, the default gateway (0.0.0.0:8000).
clean = {k: v for k, v in os.environ.items() if not k.startswith("LETSINFER_")}
log = scratch / "dev-up.log"
with log.open("w") as out:
    up = subprocess.Popen(
        ["bash", "-c", first], stdout=out, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, env=clean, start_new_session=True,
    )
report = {}
try:
    deadline = time.monotonic() + 180
    while "Ctrl-C" not in log.read_text() or health() != 200:
        assert up.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.5)
    status = subprocess.run(
        [".venv/bin/letsinfer", "status", "--json"], capture_output=True, text=True, env=clean
    )
    report["status"] = json.loads(status.stdout)
    inner = subprocess.run(
        [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, env=os.environ,
    )
    report["tests"] = {"rc": inner.returncode, "tail": inner.stdout[-3000:] + inner.stderr[-2000:]}
    report["health_after"] = health()
finally:
    os.killpg(up.pid, signal.SIGINT)  # what Ctrl-C sends
    up.wait(timeout=120)
report["pid_file_left"] = Path("/run/letsinfer/node.pid").exists()
report["log"] = log.read_text()[-3000:]
print(json.dumps(report))
"""

# A cheap lab test (a lab of three hosts, site.yml up to its doctor step) that
# checks the lab's hosts start without any letsinfer node or files.
_LAB_TEST = "tests/test_ansible_lab.py::test_site_changes_nothing_when_a_host_fails_doctor"


def test_readme_commands_in_order_dev_up_then_the_lab_tests(tmp_path: Path) -> None:
    """`./dev up` (as root, the default home, in the background), then lab
    tests: they pass, and the node `./dev up` made keeps serving."""
    if os.geteuid() != 0 or not all(
        shutil.which(t) for t in ("sshd", "nft", "nc", "nsenter", "unshare", "ip")
    ):
        pytest.skip("the lab needs root, openssh-server, nftables, netcat-openbsd, util-linux")
    first, _ = readme_commands()
    assert first == "./dev up"
    given = os.environ.get("LETSINFER_LAB_WHEELHOUSE")
    wheels = (
        Path(given).resolve()
        if given and Path(given).is_file()
        else wheelhouse.build(tmp_path / "wh")
    )
    scratch = tmp_path / "machine"
    scratch.mkdir()
    real = [Path(p).exists() for p in ("/etc/letsinfer", "/var/lib/letsinfer", "/run/letsinfer")]
    done = subprocess.run(
        [
            *("unshare", "--mount", "--net", "--propagation", "private"),
            *(sys.executable, "-c", _README_MACHINE, str(scratch), first, _LAB_TEST),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "LETSINFER_LAB_WHEELHOUSE": str(wheels)},
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    status = report["status"]
    assert status["running"] and status["role"] == "main", report
    assert status["home"] == "/etc/letsinfer" and status["paths"]["var"] == "/var/lib/letsinfer"
    assert report["tests"]["rc"] == 0, report["tests"]["tail"]
    assert report["health_after"] == 200, report["log"]
    assert not report["pid_file_left"], report["log"]
    # The machine's own paths are as they were.
    assert [
        Path(p).exists() for p in ("/etc/letsinfer", "/var/lib/letsinfer", "/run/letsinfer")
    ] == real
