"""The man pages: one per command, committed under docs/man/ as `./dev man`
writes them from the commands' help, and linked by the node role where man
looks. That an installed host gets them from the wheel is checked on the lab
(tests/test_ansible_lab.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from letsinfer.cli import COMMANDS
from letsinfer.cli.model import SUBCOMMANDS

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
COMMITTED = ROOT / "docs" / "man"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pages from the current help, written as `./dev man` writes them (in
    a fresh interpreter: what this one already imported cannot change them)."""
    folder = tmp_path_factory.mktemp("man")
    done = subprocess.run(
        [sys.executable, "-m", "letsinfer.cli.man_pages", str(folder)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return folder


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.1")}


def test_every_command_has_a_committed_page_and_every_page_a_command(generated: Path) -> None:
    missing = sorted(names(generated) - names(COMMITTED))
    orphaned = sorted(names(COMMITTED) - names(generated))
    assert not missing, f"commands without a page in docs/man: {missing}; run ./dev man"
    assert not orphaned, f"pages in docs/man of no command: {orphaned}; run ./dev man"


def test_no_committed_page_is_stale(generated: Path) -> None:
    stale = sorted(
        name
        for name in names(generated) & names(COMMITTED)
        if (generated / name).read_text() != (COMMITTED / name).read_text()
    )
    assert not stale, f"stale in docs/man (its command's help changed): {stale}; run ./dev man"


def test_lazily_loaded_commands_get_pages_too(generated: Path) -> None:
    """`model`'s subcommands load only when looked up; each still has a page."""
    have = names(generated)
    for name in COMMANDS:
        assert f"letsinfer-{name}.1" in have, name
    for name in SUBCOMMANDS:
        assert f"letsinfer-model-{name}.1" in have, name
    assert "letsinfer-model-adapter-add.1" in have  # a lazy group's own subcommand


def test_a_page_holds_no_build_date(generated: Path) -> None:
    """A page changes only when its help does: no date in the header."""
    for page in generated.glob("*.1"):
        header = next(line for line in page.read_text().splitlines() if line.startswith(".TH "))
        assert ' 1 "" ' in header, (page.name, header)


@pytest.mark.skipif(shutil.which("man") is None, reason="needs man-db (tasks.py system_packages)")
def test_man_shows_the_page_with_options_as_typed() -> None:
    shown = subprocess.run(
        ["man", "-l", str(COMMITTED / "letsinfer-model-pull.1")],
        capture_output=True,
        text=True,
        env={**os.environ, "MANWIDTH": "100", "LC_ALL": "C.UTF-8"},
    )
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "letsinfer-model-pull - Pull a GGUF model from a Hugging Face-compatible hub" in text
    assert "SYNOPSIS\n       letsinfer model pull [OPTIONS] REPO" in text
    # ASCII hyphens and quotes: an option or command copied from the page works
    assert "--min-resident DURATION" in text
    assert "`letsinfer model install`" in text
    assert "letsinfer-model(1)" in text


PLAY = """
- name: Link the man pages
  hosts: all
  gather_facts: false
  tasks:
    - name: What install.yml found
      ansible.builtin.stat:
        path: "{{ node_root }}/current"
      register: node_current
    - name: The node role's man page tasks
      ansible.builtin.include_role:
        name: letsinfer.cluster.node
        tasks_from: man
"""


def play(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    host:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    variables = {"node_root": str(tmp_path / "opt"), "node_man_dir": str(tmp_path / "man1")}
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            *("-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")),
            *("-e", json.dumps(variables), *args),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )


def recap(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.rsplit("PLAY RECAP", 1)[1]


@pytest.mark.timeout(300)
def test_the_node_role_links_the_current_release_s_pages(tmp_path: Path) -> None:
    man1 = tmp_path / "man1"
    # check mode on a fresh host: nothing installed yet, nothing to link, no error
    assert "failed=0" in recap(play(tmp_path, "--check"))
    assert not man1.exists()

    release = tmp_path / "opt" / "releases" / "0.1.0" / "share" / "man" / "man1"
    release.mkdir(parents=True)
    for name in ("letsinfer.1", "letsinfer-model-pull.1"):
        shutil.copy(COMMITTED / name, release / name)
    (tmp_path / "opt" / "current").symlink_to(tmp_path / "opt" / "releases" / "0.1.0")
    man1.mkdir()
    # a page of a command a former release had, and another tool's page
    pages = tmp_path / "opt" / "current" / "share" / "man" / "man1"
    (man1 / "letsinfer-gone.1").symlink_to(pages / "letsinfer-gone.1")
    (man1 / "other.1").write_text(".TH OTHER 1\n")

    before = sorted(p.name for p in man1.iterdir())
    assert "changed=0" not in recap(play(tmp_path, "--check"))  # says what it would do
    assert sorted(p.name for p in man1.iterdir()) == before  # and does nothing

    assert "changed=0" not in recap(play(tmp_path))
    assert sorted(p.name for p in man1.iterdir()) == [
        "letsinfer-model-pull.1",
        "letsinfer.1",
        "other.1",
    ]
    page = man1 / "letsinfer-model-pull.1"
    # through `current`: an upgrade's pages show without relinking
    assert os.readlink(page) == str(pages / page.name)
    assert page.read_text() == (COMMITTED / page.name).read_text()

    assert "changed=0" in recap(play(tmp_path))  # idempotent


@pytest.mark.skipif(shutil.which("man") is None, reason="needs man-db (tasks.py system_packages)")
def test_help_text_is_shown_as_written_not_read_as_roff(tmp_path: Path) -> None:
    import click

    from letsinfer.cli.man_pages import render

    @click.command()
    @click.option("--pattern", help=r"A regular expression such as '^v\d+' (quoted).")
    def tricky(pattern: str) -> None:
        """Tricky help.

        \b
        .hidden starts with a dot
          kept   as   typed

        Then a path: C:\\new\\table.
        """

    page = tmp_path / "letsinfer-tricky.1"
    page.write_text(render(click.Context(tricky, info_name="letsinfer-tricky")))
    shown = subprocess.run(
        ["man", "-l", str(page)],
        capture_output=True,
        text=True,
        env={**os.environ, "MANWIDTH": "100", "LC_ALL": "C.UTF-8"},
    )
    assert shown.returncode == 0, shown.stderr
    assert ".hidden starts with a dot\n" in shown.stdout
    assert "  kept   as   typed" in shown.stdout
    assert r"C:\new\table." in shown.stdout
    assert r"'^v\d+'" in shown.stdout
