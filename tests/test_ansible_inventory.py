"""Bad inventories are refused before any host is contacted, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def playbook(name: str, inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    bindir = Path(sys.executable).parent
    return subprocess.run(
        [str(bindir / "ansible-playbook"), "-i", str(inventory), f"playbooks/{name}", *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"},
    )


def inventory(tmp_path: Path, mains: dict[str, str], children: dict[str, str]) -> Path:
    def hosts(group: dict[str, str]) -> str:
        # addresses in TEST-NET-1: never contacted, validation stops first
        return "".join(f"        {n}:\n          ansible_host: '{a}'\n" for n, a in group.items())

    path = tmp_path / "hosts.yml"
    path.write_text(
        "all:\n  children:\n"
        "    letsinfer_main:\n      hosts:\n" + (hosts(mains) or "        {}\n")
        + "    letsinfer_children:\n      hosts:\n" + (hosts(children) or "        {}\n")
    )  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("mains", "children", "message"),
    [
        ({}, {"n1": "192.0.2.2"}, "has 0 host(s) in group 'letsinfer_main'"),
        (
            {"a": "192.0.2.1", "b": "192.0.2.2"},
            {},
            "has 2 host(s) in group 'letsinfer_main' (a, b); exactly one main is required",
        ),
        ({"main": "192.0.2.1"}, {"Bad_Name": "192.0.2.2"}, "Host 'Bad_Name'"),
        ({"main": "192.0.2.1"}, {"n1": "999.0.2.2"}, "address '999.0.2.2'"),
        ({"main": "192.0.2.1"}, {"n1": "192.0.2.1"}, "Several hosts share an address"),
    ],
)
def test_site_refuses_a_bad_inventory_before_contacting_hosts(
    tmp_path: Path, mains: dict[str, str], children: dict[str, str], message: str
) -> None:
    result = playbook("site.yml", inventory(tmp_path, mains, children))
    assert result.returncode != 0
    assert message in " ".join(result.stdout.split())
    assert "Gathering Facts" not in result.stdout  # stopped before any host was reached


def test_upgrade_requires_a_wanted_version(tmp_path: Path) -> None:
    inv = inventory(tmp_path, {"main": "192.0.2.1"}, {})
    result = playbook("upgrade.yml", inv, "--limit", "main", "--check")
    assert result.returncode != 0
    assert "upgrade_version" in result.stdout
