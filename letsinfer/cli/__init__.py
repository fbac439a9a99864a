"""The ``letsinfer`` command: day-2 operations, each leaf with a declared scope.

Every call starts a fresh interpreter (people, scripts and the Ansible modules
call it many times), so a call imports only the modules of the command it
runs: the top-level commands are listed here with their one-line summary and
the modules that define them, and a module is imported when its command is
looked up. ``letsinfer --help`` imports none of them.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from letsinfer import __version__
from letsinfer.cli.scope import load_context

# name -> (modules that define the command and its subcommands, its summary).
# The summary is the first sentence of the command's own help (a test holds
# the two together), shown by `letsinfer --help` without importing the module.
COMMANDS: dict[str, tuple[tuple[str, ...], str]] = {
    "audit": (("audit",), "The audit chain of every mutation and denial."),
    "auth": (("auth",), "API keys and controllers."),  # `auth controller`: cli/auth.py
    "bundle": (
        ("bundle",),
        "Offline bundles: create on a connected machine, import on an air-gapped one.",
    ),
    "cluster": (
        ("cluster",),
        "Stop, start, restart (rolling) the whole cluster, or show its state.",
    ),
    "controller": (("controller",), "Act as a paired controller from this workstation."),
    "doctor": (("doctor",), "Check this machine before (and after) letsinfer runs on it."),
    "eval": (
        ("evals",),
        "Eval suites: run one against a model through the gateway, list and show runs.",
    ),
    "exposure": (
        ("exposure",),
        "Publish the inference plane over TLS on one port: enable, status, disable.",
    ),
    "fleet": (
        ("fleet",),
        "Install, firewall, upgrade and wipe machines with the Ansible collection.",
    ),
    "join": (
        ("join",),
        "Enroll this machine with a main's join code (`letsinfer node add --code`).",
    ),
    "mirror": (("mirror",), "Imported artifacts, kept by sha256: add, list, find unused, remove."),
    "model": (
        ("model",),  # its subcommands' modules load when looked up (cli/model.py)
        "Model services: add, pull, place, start, stop, upgrade, remove.",
    ),
    "node": (
        ("node", "node_enrollment", "storage"),
        "Nodes: initialise, enroll, list, pause, remove, move, disk use.",
    ),
    "release": (("release",), "Runtime releases and the keys that sign releases and bundles."),
    "request": (("usage",), "What happened to one request."),
    "service": (
        ("service",),
        "Run this node in the background: start, stop, status, restart.",
    ),
    "status": (("status",), "This node: role, whether it runs, what it serves and in which state."),
    "top": (("top",), "A live view of the cluster."),
    "topology": (
        ("node",),
        "Nodes, their GPUs, the placement groups on them and their data links.",
    ),
    "up": (("up",), "Start this node in the foreground; Ctrl-C stops it and its engines."),
    "usage": (("usage",), "Requests and tokens summed per API key, model, node, tag or project."),
    "webhook": (("webhook",), "Signed webhooks (Standard Webhooks) sent on cluster events."),
    "user": (("user",), "Portal accounts: approve, suspend, remove, reset a password."),
    "project": (("project",), "Projects: members, models and the limits their keys share."),
    "wheelhouse": (
        ("wheelhouse",),
        "Signed wheelhouses: what a node that trusts release keys may install.",
    ),
}


def _permission_error(ctx: click.Context, path: str | None) -> click.ClickException:
    """The sentence for a file this user may not read or write: whose files
    they are, and the group that would let them in."""
    import getpass

    from letsinfer.home import ADMIN_GROUP, Home, admin_gid

    home = Home.resolve(ctx.params.get("home"))
    what = f"permission denied on {path}" if path else "permission denied"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "$USER"
    join = (
        f"ask an administrator to add you to the {ADMIN_GROUP!r} group "
        f"(`usermod -aG {ADMIN_GROUP} {user}`, then log in again)"
        if admin_gid() is not None
        else f"this machine has no {ADMIN_GROUP!r} group yet (create it with "
        f"`groupadd --system {ADMIN_GROUP}`, add users to it, and start the node again)"
    )
    return click.ClickException(
        f"{what}: the node's files in {home.label} are for root and members of the "
        f"{ADMIN_GROUP!r} group. Run the command as root (sudo), or {join}. "
        "Keys and other secrets stay root's."
    )


def _as_click_error(ctx: click.Context, exc: Exception) -> click.ClickException | None:
    """Errors of letsinfer's own that say what is wrong in a sentence, and
    permission problems. Modules are looked up only if already imported: an
    exception of a class whose module was never imported cannot have been
    raised."""
    if isinstance(exc, PermissionError):
        return _permission_error(ctx, exc.filename)
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 and isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        if "unable to open database" in text or "readonly database" in text:
            return _permission_error(ctx, None)
    store = sys.modules.get("letsinfer.store.authority")
    artifacts = sys.modules.get("letsinfer.contracts.artifacts")
    config = sys.modules.get("letsinfer.config")
    if (store and isinstance(exc, store.StoreError)) or (
        artifacts and isinstance(exc, artifacts.ModelFileError)
    ):
        return click.ClickException(str(exc))
    if config and isinstance(exc, config.ConfigError):
        err = click.ClickException(str(exc))
        err.exit_code = 2
        return err
    return None


def _write_commands(formatter: click.HelpFormatter, rows: list[tuple[str, str]]) -> None:
    """click's two-column listing, without breaking a word at a hyphen (an
    option name such as --ca-fingerprint stays whole)."""
    import textwrap

    first = min(max(len(name) for name, _ in rows), 30) + 2
    width = max((formatter.width or 80) - formatter.current_indent - first, 20)
    with formatter.section("Commands"):
        for name, text in rows:
            lines = textwrap.wrap(text, width, break_on_hyphens=False) or [""]
            pad = " " * formatter.current_indent
            if len(name) + 2 > first:
                formatter.write(f"{pad}{name}\n")
                lines_at = 0
            else:
                formatter.write(f"{pad}{name:<{first}}{lines[0]}\n")
                lines_at = 1
            for line in lines[lines_at:]:
                formatter.write(f"{pad}{' ' * first}{line}\n")


class _Group(click.Group):
    """Lists its subcommands with the whole first sentence of each one's help,
    wrapped, where click would cut it at the terminal's width."""

    group_class = type  # its subgroups are of this class too

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=1000)))
        if rows:
            _write_commands(formatter, rows)


class LazyGroup(_Group):
    """A group whose subcommands live in modules of their own, imported when
    the subcommand is looked up (``modules``: name -> module under
    letsinfer.cli): a call loads only what its command uses."""

    def __init__(self, *args: Any, modules: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.modules = modules or {}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.modules:
            importlib.import_module(f"letsinfer.cli.{self.modules[cmd_name]}")  # registers it
        return self.commands.get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.modules))


class _Root(click.Group):
    group_class = _Group

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        # Every module, even when the command is there already: another import
        # may have registered `auth` without `auth controller` (its own module).
        for module in COMMANDS.get(cmd_name, ((), ""))[0]:
            importlib.import_module(f"letsinfer.cli.{module}")  # registers on `cli`
        return self.commands.get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (
                name,
                COMMANDS[name][1] if name in COMMANDS else self.commands[name].get_short_help_str(),
            )
            for name in self.list_commands(ctx)
        ]
        _write_commands(formatter, rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except Exception as exc:
            err = _as_click_error(ctx, exc)
            if err is None:
                raise
            raise err from exc


@click.group(cls=_Root)
@click.version_option(__version__, prog_name="letsinfer")
@click.option(
    "--home",
    envvar="LETSINFER_HOME",
    metavar="DIR",
    help="Keep all of this node's files under DIR (default as root: /etc/letsinfer, "
    "/var/lib/letsinfer and /run/letsinfer; otherwise ~/.local/share/letsinfer).",
)
@click.option(
    "--controller",
    envvar="LETSINFER_CONTROLLER",
    metavar="NAME",
    help="Run the command on the main this workstation paired with as NAME, over mutual "
    "TLS (default: the one `letsinfer controller use` chose, if any; see docs/admin-api.md).",
)
@click.pass_context
def cli(ctx: click.Context, home: str | None, controller: str | None) -> None:
    """letsinfer: a few machines with GPUs (or none) as one OpenAI-compatible service."""
    ctx.obj = load_context(home, controller)


def home_first(argv: list[str]) -> list[str]:
    """``--home DIR`` (and ``--controller NAME``) is accepted after the
    subcommand too (``letsinfer status --home DIR``): it moves in front, where
    click reads the group's options."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest.extend(argv[i:])
            break
        if word in ("--home", "--controller") and i + 1 < len(argv):
            front += argv[i : i + 2]
            i += 2
            continue
        (front if word.startswith(("--home=", "--controller=")) else rest).append(word)
        i += 1
    return front + rest


def main() -> None:
    cli.main(args=home_first(sys.argv[1:]), prog_name="letsinfer")
