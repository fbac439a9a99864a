"""The CLI's help, as a person reads it, and what a call costs: each command
imports only what it uses (heavy libraries stay out of `--help` and `status`;
measured times are in benchmarks/cli.py, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from letsinfer.cli import COMMANDS, cli
from letsinfer.cli.scope import ScopedCommand
from tests.nodes import letsinfer

# What no call needs unless it serves, signs or talks HTTP to another machine.
HEAVY = {"fastapi", "uvicorn", "cryptography", "numpy", "httpx", "gguf", "prometheus_client"}
# `--help` reads nothing either: no store, no settings.
NOTHING_READ = {"pydantic", "sqlite_utils", "sqlite3", "rich"}
# A read of the authority needs sqlite3 only (sqlite_utils: its inserts); JSON
# needs no console library.
READ_ONLY = HEAVY | {"sqlite_utils", "dateutil"}


def every_command() -> list[tuple[str, click.Command]]:
    ctx = click.Context(cli)
    found = []

    def walk(cmd: click.Command, path: str) -> None:
        found.append((path, cmd))
        if isinstance(cmd, click.Group):  # asked, so that lazy subcommands are loaded too
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, f"{path} {name}"
                walk(sub, f"{path} {name}")

    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None, name
        walk(command, name)
    return found


def test_the_top_level_summaries_are_each_command_s_own_first_sentence() -> None:
    ctx = click.Context(cli)
    for name, (_, summary) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.help, name
        first = " ".join(command.help.split())
        assert first.startswith(summary.rstrip(".")), (name, summary, first[:120])
    assert set(cli.commands) == set(COMMANDS), "every command is listed (lazily) in COMMANDS"


def test_every_leaf_says_where_it_runs_and_explains_every_option() -> None:
    for path, command in every_command():
        if isinstance(command, click.Group):
            continue
        assert isinstance(command, ScopedCommand), path
        assert command.help and "Runs on: " in command.help, path
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert param.help, f"`{path} {param.opts[0]}` has no help"


def test_no_help_text_is_stale() -> None:
    stale = ("later", "list and add", "not yet implemented", "coming soon")
    for path, command in every_command():
        text = " ".join((command.help or "").split()).lower()
        assert not any(word in text for word in stale), (path, text[:200])


def _imported(home: Path, *argv: str) -> tuple[int, set[str]]:
    probe = (
        "import sys\n"
        "from letsinfer.cli import cli\n"
        "try:\n"
        f"    cli.main({['--home', str(home), *argv]!r}, prog_name='letsinfer')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code or 0\n"
        "print('\\nIMPORTED', sorted({m.split('.')[0] for m in sys.modules}), code)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    line = done.stdout.rsplit("IMPORTED ", 1)[1]
    names, code = line.rsplit("]", 1)
    return int(code), set(json.loads((names + "]").replace("'", '"')))


@pytest.mark.parametrize(
    ("argv", "unwanted"),
    [
        (["--help"], HEAVY | NOTHING_READ),
        (["status"], READ_ONLY),
        (["status", "--json"], READ_ONLY),
        (["model", "list"], READ_ONLY),
        (["model", "list", "--json"], READ_ONLY | {"rich"}),
        (["node", "list", "--json"], READ_ONLY | {"rich"}),
    ],
)
def test_help_status_and_model_list_load_no_heavy_library(
    tmp_path: Path, argv: list[str], unwanted: set[str]
) -> None:
    home = tmp_path / "home"
    made = letsinfer(home, "node", "init", "--main", "--name", "quick")
    assert made.returncode == 0, made.stderr
    code, modules = _imported(home, *argv)
    assert code == 0
    assert not modules & unwanted, sorted(modules & unwanted)
