"""The README's two commands are the real ones."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import openai

from letsinfer.engines.tinymodel import SENTENCE
from tests.nodes import free_port, loopback_env, processes_using

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_ci_runs_the_readme_test_command() -> None:
    _, second = readme_commands()
    assert second in (ROOT / ".ci" / "run").read_text()


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
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=8)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], timeout=60
        )
        assert reply.choices[0].message.content == SENTENCE
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        proc.wait(timeout=60)
    assert processes_using(home) == []
