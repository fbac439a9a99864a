"""The Ansible collection ships in the wheel (pyproject's data-files), so
`letsinfer node add --ssh` works on a main installed from a wheel, with no
checkout: every file of the collection, its roles and its playbooks is
installed under share/letsinfer/ansible, and the playbooks resolve their
roles and plugins there with no ansible.cfg."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from letsinfer.cli.node_ssh import installed_playbooks

ROOT = Path(__file__).resolve().parents[1]
SHARE = "share/letsinfer/ansible"
COLLECTION = "collections/ansible_collections/letsinfer/cluster"


def tracked() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "roles", "playbooks", "collections"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [f for f in listed if not (ROOT / f).is_symlink()]  # the collection's roles link


def installed() -> dict[str, list[str]]:
    """Each file pyproject's data-files install, to where (relative to the
    prefix), its globs expanded as setuptools expands them."""
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "data-files"
    ]
    where: dict[str, list[str]] = {}
    for target, patterns in data_files.items():
        for pattern in patterns:
            for found in sorted(ROOT.glob(pattern)):
                path = found.relative_to(ROOT).as_posix()
                where.setdefault(path, []).append(f"{target}/{found.name}")
    return where


def expected(path: str) -> str:
    # Roles go inside the installed collection (the checkout links them there).
    return f"{SHARE}/{COLLECTION}/{path}" if path.startswith("roles/") else f"{SHARE}/{path}"


def test_every_file_of_the_collection_is_installed_where_ansible_finds_it() -> None:
    files, where = tracked(), installed()
    assert any(f.endswith("node_add.yml") for f in files)
    wrong = {f: where.get(f) for f in files if where.get(f) != [expected(f)]}
    assert not wrong, f"missing from (or misplaced by) pyproject's data-files: {wrong}"
    prefix = Path(sys.prefix)
    assert installed_playbooks() == prefix / SHARE / "playbooks"


def test_the_installed_playbooks_resolve_their_roles_and_plugins(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    for f in tracked():
        dest = prefix / expected(f)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest)
    playbooks = prefix / SHARE / "playbooks"
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(prefix / SHARE / "collections"),
        "ANSIBLE_CONFIG": "",  # as fleet.apply runs it there: no ansible.cfg
        "ANSIBLE_ROLES_PATH": str(tmp_path / "no-roles"),  # not the checkout's ./roles
    }
    ansible = Path(sys.executable).parent / "ansible-playbook"
    for playbook in ("node_add.yml", "site.yml"):
        checked = subprocess.run(
            [str(ansible), "--syntax-check", "-i", "localhost,", str(playbooks / playbook)],
            cwd=tmp_path,  # away from the checkout's ansible.cfg
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert checked.returncode == 0, f"{playbook}: {checked.stdout}{checked.stderr}"
