"""Where a command may run: main, child or all. Checked before any handler runs.

A command run in the wrong place is refused with the main's address; a child
never forwards a mutating command to the main. The refusal is audited in this
home's authority when the caller may write it (aggregated: a loop of denied
commands adds a few records with counts).
"""

from __future__ import annotations

import inspect
import os
import pwd
from dataclasses import dataclass
from typing import Any, Literal

import click

from letsinfer.home import Home
from letsinfer.identity import NodeIdentity, load_identity

Scope = Literal["main", "child", "all"]


@dataclass
class CliContext:
    home: Home
    identity: NodeIdentity | None
    controller: str | None = None  # --controller or LETSINFER_CONTROLLER
    # The paired main this command runs on (letsinfer.cli.remote.Pairing), or
    # None: here.
    remote: Any = None


class ScopeError(click.ClickException):
    exit_code = 3


def check_scope(scope: Scope, command: str, identity: NodeIdentity | None) -> None:
    if scope == "all":
        return
    if identity is None:
        raise ScopeError(
            f"`{command}` runs on a {scope} node, and this home is not a letsinfer node yet. "
            "Start a main node with `letsinfer up` (or pass --home)."
        )
    role = "child" if identity.role == "candidate" else identity.role
    if role == scope:
        return
    if identity.role == "candidate":
        raise ScopeError(
            f"`{command}` runs on the main node only; this machine is a candidate, not enrolled "
            "in a cluster yet. To enroll it: `letsinfer up` here, `letsinfer node add <this "
            "address>` on the main, then `letsinfer node accept` here."
        )
    if role == "child":
        where = identity.main_address or "the main node"
        raise ScopeError(
            f"`{command}` runs on the main node only; this machine is a child of the main "
            f"at {where}. Run it there."
        )
    raise ScopeError(f"`{command}` runs on a child node only; this machine is the main node.")


Role = Literal["viewer", "operator", "administrator"]
# Never from a controller, by design: people and projects (a shell on the
# main is what makes an administrator; DESIGN.md, People and integrations).
SHELL_ONLY = "shell"
Remote = Role | Literal["shell"]


class ScopedCommand(click.Command):
    """``remote``: the role a paired controller needs to run this command on
    its main through the admin API; None: the API has no operation for it
    yet; SHELL_ONLY: it never will. ``remote_with``: the flag that alone
    makes the command go to the main (``doctor --cluster``); without it, the
    command runs here even with a controller selected."""

    def __init__(
        self,
        *args: Any,
        scope: Scope,
        remote: Remote | None = None,
        remote_with: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.scope: Scope = scope
        self.remote: Remote | None = remote
        self.remote_with = remote_with
        if self.help is not None:  # cleaned first: the added line would defeat click's dedent
            where = f"Runs on: {scope}."
            if remote == SHELL_ONLY:
                where += " Only from a shell on the main, never from a controller."
            elif remote is not None and remote_with is not None:
                flag = "--" + remote_with.replace("_", "-")
                where += f" With {flag}, from a paired controller: {remote} role."
            elif remote is not None:
                where += f" From a paired controller: {remote} role."
            self.help = f"{inspect.cleandoc(self.help)}\n\n{where}"

    def invoke(self, ctx: click.Context) -> Any:
        cli = ctx.ensure_object(CliContext)
        # Without its remote_with flag, a command is about the machine it runs on.
        remote_form = self.remote_with is None or bool(ctx.params.get(self.remote_with))
        if remote_form and (self.scope == "main" or self.remote is not None):
            from letsinfer.cli import remote

            pairing = remote.selected(cli.home, cli.controller)
            if pairing is not None:
                remote.admit(pairing, ctx.command_path.partition(" ")[2], self.remote)
                cli.remote = pairing
                return super().invoke(ctx)
        require_scope(cli, self.scope, ctx.command_path)
        return super().invoke(ctx)


def require_scope(cli: CliContext, scope: Scope, command_path: str) -> None:
    """Refuse (and audit the refusal) unless this home may run ``command_path``;
    for a command whose scope depends on an option (``doctor --cluster``)."""
    try:
        check_scope(scope, command_path, cli.identity)
    except ScopeError:
        _audit_refusal(cli, command_path.partition(" ")[2], scope)
        raise


def _audit_refusal(cli: CliContext, command: str, scope: Scope) -> None:
    """Count a scope denial into this home's audit chain, if it has one this
    caller may write (a refused command creates nothing)."""
    db = cli.home.database
    if not db.is_file() or not os.access(db, os.R_OK | os.W_OK):
        return
    from letsinfer import config
    from letsinfer.audit.anchor import open_authority
    from letsinfer.audit.denials import record_denial

    try:
        interval = config.load(cli.home.config_file).audit.denial_interval_s
    except config.ConfigError:
        interval = config.AuditSettings().denial_interval_s
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = f"uid{os.geteuid()}"
    role = cli.identity.role if cli.identity else "not a node"
    reason = f"runs on {scope} only; this is {role}"
    try:
        store = open_authority(cli.home)
    except Exception:  # an unreadable store: the refusal itself still stands
        return
    try:
        record_denial(store, f"cli:{user}", f"cli:{command}", reason, interval)
    finally:
        store.close()


def scoped(group: click.Group, name: str | None = None, *, scope: Scope, **kwargs: Any) -> Any:
    """``@scoped(group, scope="main")`` declares a leaf command and its scope."""
    return group.command(name, cls=ScopedCommand, scope=scope, **kwargs)


def load_context(home_option: str | None, controller: str | None = None) -> CliContext:
    home = Home.resolve(home_option)
    return CliContext(home=home, identity=load_identity(home.identity_file), controller=controller)
