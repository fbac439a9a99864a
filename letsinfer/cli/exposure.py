"""``letsinfer exposure``: publish the inference plane beyond the LAN over
TLS on one port, to listed sources (docs/exposure.md).

The settings live in ``<etc>/exposure.json``, beside the config. A running
main applies them at once through its admin socket (a failure there puts the
previous settings back: nothing is half-applied); a stopped one at its next
start. ``--plain`` moves the plain listener at the next start (its socket is
bound once). The firewall role opens the port (the node never loads nftables
rules): the command prints the role's variables.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import click

from letsinfer import config
from letsinfer.cli import cli
from letsinfer.cli.local import ask_node
from letsinfer.cli.output import emit_object
from letsinfer.cli.remote import ask_main
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.exposure import settings as stored
from letsinfer.exposure.certificate import (
    CertificateRefused,
    ServedCert,
    check_pair,
    cluster_files,
    issue_from_cluster_ca,
)
from letsinfer.exposure.report import ca_file, exposure_report
from letsinfer.exposure.settings import Exposure, ExposureSettingsError


@cli.group()
def exposure() -> None:
    """Publish the inference plane over TLS on one port: enable, status, disable.

    Only the gateway (/v1, /health, the portal) is published; the control,
    agent, engine and metrics ports never are. See docs/exposure.md.
    """


def _ca_file(ctx: CliContext) -> Path:
    assert ctx.identity is not None
    return ca_file(ctx.home, ctx.identity)


def _refuse_ports(ctx: CliContext, port: int) -> None:
    settings = config.load(ctx.home.config_file)
    taken = {
        settings.gateway.port: "the plain gateway",
        settings.control.port: "the control plane",
        settings.agent.api_port: "the agent plane",
        settings.gateway.metrics_port: "metrics",
    }
    if port in taken:
        raise click.ClickException(
            f"--port {port} is {taken[port]}'s port: choose another (e.g. 443). Nothing changed."
        )


def _firewall_vars(exposure: Exposure | None) -> str:
    port = exposure.port if exposure else 0
    sources = list(exposure.sources) if exposure else []
    return (
        f"set firewall_exposure_port: {port} and firewall_exposure_sources: {sources} for the "
        "main, then `letsinfer fleet apply firewall -i INVENTORY` (docs/exposure.md)"
    )


def _apply(ctx: CliContext, previous: Exposure | None) -> dict[str, Any] | None:
    """The running node serves the new settings, or they are put back."""
    answer = ask_node(ctx.home, "POST", "/v1/local/exposure/apply")
    if answer is not None and answer.get("error"):
        if previous is None:
            stored.remove(ctx.home)
        else:
            stored.save(ctx.home, previous)
        raise click.ClickException(
            f"the running node could not publish it: {answer['error']}. Nothing changed."
        )
    return answer


def _show_cert(cert: ServedCert) -> None:
    click.echo(f"  subject   {cert.subject}")
    click.echo(f"  names     {', '.join(cert.sans) or '(none: clients check the subject)'}")
    click.echo(f"  expires   {cert.not_after:%Y-%m-%d %H:%M} UTC")


@scoped(exposure, "enable", scope="main")
@click.option(
    "--cert",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="The server certificate (PEM; its chain may follow it).",
)
@click.option(
    "--key",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="The certificate's private key (PEM, unencrypted).",
)
@click.option(
    "--cluster-ca",
    is_flag=True,
    help="Have the cluster CA issue the certificate (for --san); clients trust its CA file.",
)
@click.option(
    "--san",
    "sans",
    multiple=True,
    metavar="NAME_OR_ADDRESS",
    help="A DNS name or IP address clients use (with --cluster-ca; repeatable).",
)
@click.option(
    "--port", type=click.IntRange(1, 65535), default=443, show_default=True, help="The TLS port."
)
@click.option(
    "--from",
    "sources",
    multiple=True,
    metavar="CIDR",
    help="A source network allowed (repeatable; default: anywhere).",
)
@click.option(
    "--address",
    default="0.0.0.0",
    show_default=True,
    metavar="ADDRESS",
    help="The address the TLS listener binds.",
)
@click.option(
    "--plain",
    type=click.Choice(stored.PLAIN_CHOICES),
    default="lan",
    show_default=True,
    help="The plain HTTP listener: the LAN as configured, or off (loopback only; "
    "from the next start).",
)
@click.pass_obj
def enable(
    ctx: CliContext,
    cert: Path | None,
    key: Path | None,
    cluster_ca: bool,
    sans: tuple[str, ...],
    port: int,
    sources: tuple[str, ...],
    address: str,
    plain: str,
) -> None:
    """Publish the inference plane over TLS on one port to the listed sources.

    With --cert and --key, the operator's certificate; with --cluster-ca and
    --san, one the cluster CA issues (the command prints the CA file clients
    must trust). A certificate file replaced on disk is served to the next
    connection without a restart. A bad certificate or key is refused with
    nothing changed.
    """
    if cluster_ca == bool(cert or key) or (not cluster_ca and not (cert and key)):
        raise click.ClickException(
            "give either --cert FILE and --key FILE, or --cluster-ca with --san NAME_OR_ADDRESS"
        )
    if sans and not cluster_ca:
        raise click.ClickException(
            "--san goes with --cluster-ca (your own certificate names itself)"
        )
    try:
        nets = stored.parse_sources(sources)
        previous = stored.load(ctx.home)
    except ExposureSettingsError as exc:
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    _refuse_ports(ctx, port)
    try:
        if cluster_ca:
            cert, key = cluster_files(ctx.home)
            served = issue_from_cluster_ca(
                ctx.home.ca_key,
                _ca_file(ctx),
                sans,
                cert,
                key,
                settle=lambda *paths: stored.owned_like_home(ctx.home, *paths),
            )
        else:
            assert cert is not None and key is not None
            cert, key = cert.absolute(), key.absolute()
            served = check_pair(cert, key)
    except CertificateRefused as exc:
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    wanted = Exposure(
        port=port,
        cert=str(cert),
        key=str(key),
        sources=nets,
        host=address,
        cluster_ca=cluster_ca,
        sans=tuple(sans),
        plain=plain,
    )
    stored.save(ctx.home, wanted)
    answer = _apply(ctx, previous)
    click.echo(f"published: https://{address}:{port}/v1 (and /health) to {', '.join(nets)}")
    _show_cert(served)
    if cluster_ca:
        click.echo(f"  trust     clients trust the cluster CA: {_ca_file(ctx)}")
    click.echo(
        "  node      serving now"
        if answer is not None
        else "  node      not running: published at its next start"
    )
    if plain == "off" or (previous is not None and previous.plain != plain):
        click.echo(
            f"  plain     {plain}: takes effect at the next start (letsinfer service restart)"
        )
    click.echo(f"  firewall  the firewall role opens only this port: {_firewall_vars(wanted)}")


@scoped(exposure, "status", scope="main", remote="viewer")
@click.option("--json", "as_json", is_flag=True, help="Output JSON.")
@click.pass_obj
def status(ctx: CliContext, as_json: bool) -> None:
    """What is published, to whom, the certificate and when it expires."""
    if ctx.remote is not None:
        report = ask_main(ctx, "GET", "/v1/ops/exposure")
    else:
        node = ask_node(ctx.home, "GET", "/v1/local/exposure", timeout=10)
        try:
            report = exposure_report(ctx.home, ctx.identity, node)
        except ExposureSettingsError as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        emit_object(report)
        return
    if not report["published"]:
        click.echo("not published: the inference plane serves the LAN only")
        return
    click.echo(f"published: {report['url']} to {', '.join(report['sources'])}")
    cert = report["certificate"]
    if "error" in cert:
        click.echo(f"  certificate  {cert['error']}")
    else:
        left = dt.datetime.fromisoformat(cert["not_after"]) - dt.datetime.now(dt.UTC)
        click.echo(f"  subject   {cert['subject']}")
        click.echo(f"  names     {', '.join(cert['sans']) or '(none)'}")
        click.echo(f"  expires   {cert['not_after']} ({left.days} days left)")
    if report["cluster_ca"]:
        click.echo(f"  trust     {report['ca_file']}")
    click.echo(f"  plain     {report['plain']}")
    node = report["node"]
    if node is None:
        click.echo("  node      not running")
    else:
        state = "serving" if node.get("listening") else "not serving"
        click.echo(f"  node      {state}" + (f": {node['error']}" if node.get("error") else ""))


@scoped(exposure, "disable", scope="main")
@click.pass_obj
def disable(ctx: CliContext) -> None:
    """Close the TLS port; the inference plane serves the LAN only again."""
    try:
        previous = stored.load(ctx.home)
    except ExposureSettingsError:
        previous = None  # a damaged file is removed all the same
    if not stored.remove(ctx.home):
        click.echo("not published: nothing to close")
        return
    answer = ask_node(ctx.home, "POST", "/v1/local/exposure/apply")
    click.echo(
        "closed: the inference plane serves the LAN only"
        + ("" if answer else " (node not running)")
    )
    if previous is not None and previous.plain == "off":
        click.echo(
            "  plain     the LAN listener returns at the next start (letsinfer service restart)"
        )
    click.echo(f"  firewall  close the port with the firewall role: {_firewall_vars(None)}")
