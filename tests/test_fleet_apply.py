"""``letsinfer fleet apply``: a real playbook through ansible-runner, and its progress model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from letsinfer.fleet.apply import Progress

ROOT = Path(__file__).resolve().parent.parent


def fleet(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    bindir = str(Path(sys.executable).parent)
    return subprocess.run(
        [sys.executable, "-m", "letsinfer", "fleet", "apply", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=180,
        env={**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")},
    )


def local_site(tmp_path: Path, tasks: str) -> Path:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "inventory.yml").write_text(
        "all:\n  hosts:\n    alpha:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    (tmp_path / "playbooks" / "demo.yml").write_text(
        "- name: Demo | Touch a file\n  hosts: all\n  gather_facts: false\n  tasks:\n" + tasks
    )
    return tmp_path


def test_apply_runs_a_playbook_and_summarises_per_host(tmp_path: Path) -> None:
    target = tmp_path / "touched"
    site = local_site(
        tmp_path,
        "    - name: Demo | Create the file\n"
        f"      ansible.builtin.file: {{path: {target}, state: touch, mode: '0600'}}\n"
        "    - name: Demo | Read it\n"
        f"      ansible.builtin.stat: {{path: {target}}}\n",
    )
    result = fleet("demo", "-i", "inventory.yml", "--json", "-e", "unused=1", cwd=site)
    assert result.returncode == 0, result.stderr + result.stdout
    summary = json.loads(result.stdout)
    assert summary["hosts"]["alpha"]["changed"] == 1
    assert summary["hosts"]["alpha"]["ok"] == 2
    assert summary["failures"] == []
    assert target.exists()

    table = fleet("demo", "-i", "inventory.yml", cwd=site)  # the live view, then the table
    assert table.returncode == 0, table.stderr
    assert "summary" in table.stdout and "alpha" in table.stdout


def test_apply_check_mode_changes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "never"
    site = local_site(
        tmp_path,
        "    - name: Demo | Create the file\n"
        f"      ansible.builtin.file: {{path: {target}, state: touch, mode: '0600'}}\n",
    )
    result = fleet("demo", "-i", "inventory.yml", "--check", "--json", cwd=site)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["hosts"]["alpha"]["changed"] == 1
    assert not target.exists()


def test_apply_fails_with_the_host_task_and_message(tmp_path: Path) -> None:
    site = local_site(
        tmp_path,
        "    - name: Demo | Refuse\n      ansible.builtin.fail: {msg: the disk is full}\n",
    )
    result = fleet("demo", "-i", "inventory.yml", "--json", cwd=site)
    assert result.returncode != 0
    summary = json.loads(result.stdout)
    assert summary["hosts"]["alpha"]["failed"] == 1
    assert summary["failures"] == [
        {"host": "alpha", "task": "Demo | Refuse", "message": "the disk is full"}
    ]


def test_apply_refuses_unknown_playbooks_and_inventories(tmp_path: Path) -> None:
    site = local_site(tmp_path, "    - name: Demo | Nothing\n      ansible.builtin.meta: noop\n")
    missing = fleet("nope", "-i", "inventory.yml", cwd=site)
    assert missing.returncode == 1 and "no playbook 'nope'" in missing.stderr
    no_inv = fleet("demo", "-i", "missing.yml", cwd=site)
    assert no_inv.returncode == 1 and "no inventory at missing.yml" in no_inv.stderr
    bad_var = fleet("demo", "-i", "inventory.yml", "-e", "not a pair", cwd=site)
    assert bad_var.returncode == 2 and "expected KEY=VALUE" in bad_var.stderr


def test_progress_follows_runner_events() -> None:
    p = Progress()
    p.feed({"event": "playbook_on_play_start", "event_data": {"play": "Nodes"}})
    p.feed({"event": "runner_on_start", "event_data": {"host": "main", "task": "Install"}})
    assert (p.hosts["main"].task, p.hosts["main"].status) == ("Install", "running")
    p.feed(
        {
            "event": "runner_on_ok",
            "event_data": {"host": "main", "task": "Install", "res": {"changed": True}},
        }
    )
    assert p.hosts["main"].status == "changed"
    p.feed(
        {
            "event": "runner_on_failed",
            "event_data": {"host": "n1", "task": "Start", "res": {"msg": "boom"}},
        }
    )
    p.feed(
        {
            "event": "runner_on_failed",
            "event_data": {"host": "n1", "task": "Probe", "ignore_errors": True, "res": {}},
        }
    )
    assert p.failures == [("n1", "Start", "boom")]
    p.feed(
        {
            "event": "playbook_on_stats",
            "event_data": {
                "ok": {"main": 3, "n1": 1},
                "changed": {"main": 1},
                "failures": {"n1": 1},
            },
        }
    )
    assert p.finished and p.play == "Nodes"
    assert (p.hosts["main"].status, p.hosts["main"].ok, p.hosts["main"].changed) == ("done", 3, 1)
    assert (p.hosts["n1"].status, p.hosts["n1"].failed) == ("failed", 1)
