"""``letsinfer exposure``: publish the inference plane beyond the LAN over
TLS on one port, to listed sources (docs/exposure.md).

The settings live in ``<etc>/exposure.json``, beside the config. A running
main applies them at once through its admin socket (a failure there puts the
previous settings back: nothing is half-applied); a stopped one at its next
start. ``--plain`` moves the plain listener at the next start (its socket is
bound once). The firewall role opens the port (the node never loads nftables
rules): the command prints the role's variables. From a paired controller,
`enable` and `disable` run on the main through its admin API
(letsinfer.exposure.publishing does the work in both places).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import click

from letsinfer.cli import cli
from letsinfer.cli.local import ask_node
from letsinfer.cli.output import emit_object
from letsinfer.cli.remote import ask_main
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.exposure import publishing
from letsinfer.exposure import settings as stored
from letsinfer.exposure.certificate import CertificateRefused, read_pem_file
from letsinfer.exposure.report import exposure_report
from letsinfer.exposure.settings import Exposure, ExposureSettingsError


@cli.group()
def exposure() -> None:
    """Publish the inference plane over TLS on one port: enable, status, disable.

    Only the gateway (/v1, /health, the portal) is published; the control,
    agent, engine and metrics ports never are. See docs/exposure.md.
    """


def _apply(ctx: CliContext, previous: Exposure | None) -> dict[str, Any] | None:
    """The running node serves the new settings, or they are put back."""
    answer = ask_node(ctx.home, "POST", "/v1/local/exposure/apply")
    if answer is not None and answer.get("error"):
        publishing.restore(ctx.home, previous)
        raise click.ClickException(
            f"the running node could not publish it: {answer['error']}. Nothing changed."
        )
    return answer


def _audit(ctx: CliContext, action: str, target: str, detail: str | None = None) -> None:
    from letsinfer.audit.anchor import open_authority

    store = open_authority(ctx.home)
    try:
        store.append_audit("cli", action, "ok", role="main", target=target, detail=detail)
    finally:
        store.close()


def _echo(lines: list[str]) -> None:
    for line in lines:
        click.echo(line)


@scoped(exposure, "enable", scope="main", remote="administrator")
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
    must trust). On the main, --cert and --key are served in place: a
    certificate file replaced on disk is served to the next connection
    without a restart. From a controller, they are this workstation's files:
    their text is sent, checked on the main and stored there (with the
    cluster CA's); to renew, run `exposure enable` again with the new files.
    A bad certificate or key is refused with nothing changed.
    """
    try:
        publishing.check_choice(cluster_ca, cert is not None, key is not None, bool(sans))
    except publishing.PublishRefused as exc:
        raise click.ClickException(str(exc)) from exc
    wanted = publishing.Wanted(port, sources, address, plain, tuple(sans))
    if ctx.remote is not None:
        said = ask_main(ctx, "POST", "/v1/ops/exposure/enable", _sent(wanted, cert, key))
        _echo(publishing.enabled_lines(said))
        return
    assert ctx.identity is not None
    pair = publishing.OwnFiles(cert, key) if cert is not None and key is not None else None
    try:
        staged = publishing.stage(ctx.home, ctx.identity, wanted, pair)
    except publishing.PublishRefused as exc:
        raise click.ClickException(str(exc)) from exc
    answer = _apply(ctx, staged.previous)
    said = publishing.enabled(ctx.home, ctx.identity, staged, node_serving=answer is not None)
    _audit(ctx, "exposure.enable", said["url"], publishing.audit_detail(staged))
    _echo(publishing.enabled_lines(said))


def _sent(wanted: publishing.Wanted, cert: Path | None, key: Path | None) -> dict[str, Any]:
    """The admin API's body: the options, and this workstation's files' text."""
    body: dict[str, Any] = {
        "port": wanted.port,
        "sources": list(wanted.sources),
        "address": wanted.address,
        "plain": wanted.plain,
        "cluster_ca": cert is None,
        "sans": list(wanted.sans),
    }
    if cert is not None and key is not None:
        cert, key = cert.absolute(), key.absolute()
        try:
            body["cert_pem"] = read_pem_file(cert, "certificate").decode(errors="replace")
            body["key_pem"] = read_pem_file(key, "key").decode(errors="replace")
        except CertificateRefused as exc:
            raise click.ClickException(f"{exc}. Nothing changed.") from exc
        body["cert_file"], body["key_file"] = str(cert), str(key)
    return body


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


@scoped(exposure, "disable", scope="main", remote="administrator")
@click.pass_obj
def disable(ctx: CliContext) -> None:
    """Close the TLS port; the inference plane serves the LAN only again."""
    if ctx.remote is not None:
        _echo(publishing.disabled_lines(ask_main(ctx, "POST", "/v1/ops/exposure/disable")))
        return
    closed, previous = publishing.unpublish(ctx.home)
    answer = ask_node(ctx.home, "POST", "/v1/local/exposure/apply") if closed else None
    said = publishing.disabled(closed, previous, node_running=answer is not None)
    _audit(ctx, "exposure.disable", "exposure", None if closed else "nothing was published")
    _echo(publishing.disabled_lines(said))
