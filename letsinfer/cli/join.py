"""``letsinfer join``: enroll this machine with a main's join code, from here."""

from __future__ import annotations

import click

from letsinfer.cli import cli
from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext, ScopedCommand


def _code(_ctx: click.Context, _param: click.Parameter, value: str) -> object:
    from letsinfer.trust.join_code import JoinCode, JoinCodeError

    try:
        return JoinCode.parse(value)
    except JoinCodeError as exc:
        raise click.BadParameter(f"not a join code: {exc}") from exc


def _address(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    from letsinfer.trust.join import control_address

    try:
        return control_address(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@cli.command("join", cls=ScopedCommand, scope="all")
@click.argument("main_address", callback=_address)
@click.argument("code", callback=_code)
@click.option("--name", help="This node's name, for a home not yet a node (default: host name).")
@click.pass_obj
def join(ctx: CliContext, main_address: str, code: object, name: str | None) -> None:
    """Enroll this machine with a main's join code (`letsinfer node add --code`).

    MAIN_ADDRESS is the main's control address (HOST or HOST:PORT, port 8443
    by default). The main is checked first: unless it presents a certificate
    of the cluster CA whose fingerprint is in the code, nothing more is sent.
    Then this node proves the code's secret (which never leaves this machine)
    and gets its certificate; a running node switches to serving as a child
    within a second. A home that is not a node yet becomes a candidate first."""
    from letsinfer import config
    from letsinfer.agent.runtime import advertise_address
    from letsinfer.audit.anchor import open_authority
    from letsinfer.authority.bootstrap import init_candidate
    from letsinfer.trust import join as joining
    from letsinfer.trust.candidate import EnrollmentError
    from letsinfer.trust.join_code import JoinCode

    assert isinstance(code, JoinCode)
    the_code: JoinCode = code  # narrowed, for the closure below too
    identity = ctx.identity
    if identity is not None and identity.enrolled:
        raise click.ClickException(
            f"this node is already the {identity.role} of a cluster; nothing changed "
            "(to move it, see `letsinfer node move-into`)"
        )

    def audit(outcome: str, detail: str) -> None:
        if not ctx.home.database.is_file():  # a fresh home refused: no chain yet
            return
        store = open_authority(ctx.home)
        try:
            store.append_audit(
                "cli",
                "node.join",
                outcome,
                target=main_address,
                detail=f"code {the_code.code_id}: " + detail,
            )
        finally:
            store.close()

    settings = config.load(ctx.home.config_file)
    try:
        checked = joining.check_main(main_address, the_code)
    except EnrollmentError as exc:
        audit("denied", str(exc))
        raise click.ClickException(str(exc)) from exc
    if identity is None:
        identity = init_candidate(ctx.home, name=name)
        console.print(f"this home is now candidate [bold]{identity.name}[/bold]")
    agent = settings.agent
    agent_address = f"{advertise_address(agent.api_host, agent.advertise)}:{agent.api_port}"
    try:
        moved = joining.enroll(ctx.home, identity, main_address, the_code, checked, agent_address)
    except EnrollmentError as exc:
        audit("denied", str(exc))
        raise click.ClickException(f"{exc}. Nothing changed here.") from exc
    audit("ok", f"cluster sha256:{moved.cluster}")
    console.print(
        f"this node ([bold]{moved.name}[/bold]) is now a child of the main at {main_address}; "
        "a running node switches within a second"
    )
