"""`letsinfer node add --ssh HOST`: onboard one machine from the main.

fabric proves the host is reachable, is the host known for that address and
lets the key in (``fleet.ssh_reach``); then the collection's node_add.yml
runs for that host alone (``fleet.node_add``): identity check, doctor (a
failure stops it with nothing changed), firewall, install, service, enrollment
bound to this main's CA, until the main sees the node active. Progress is
shown live; a second run changes nothing and says so.
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext


@dataclass(frozen=True)
class SshOptions:
    host: str
    user: str
    identity: Path | None
    wheelhouse: Path | None
    index_url: str | None
    playbooks: Path | None
    extra: tuple[str, ...]


def installed_playbooks() -> Path:
    """Where the wheel installs the collection's playbooks (pyproject's data-files)."""
    return Path(sys.prefix) / "share" / "letsinfer" / "ansible" / "playbooks"


def _playbooks(given: Path | None) -> Path:
    """--playbooks, else ./playbooks, else the checkout letsinfer runs from,
    else the collection installed with letsinfer."""
    from letsinfer.fleet.node_add import PLAYBOOK

    checkout = Path(__file__).resolve().parents[2] / "playbooks"
    candidates = [given] if given else [Path.cwd() / "playbooks", checkout, installed_playbooks()]
    for folder in candidates:
        if (folder / PLAYBOOK).is_file():
            return folder.absolute()
    where = str(given) if given else ", ".join(str(c) for c in candidates)
    raise click.ClickException(
        f"no {PLAYBOOK} in {where}: `node add --ssh` runs the letsinfer.cluster "
        "collection's playbook (installed with letsinfer); pass --playbooks DIR"
    )


def _address(host: str) -> str:
    """HOST as an IP address: the firewall's member sets hold addresses, never names."""
    try:
        found = socket.getaddrinfo(host, 22, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise click.ClickException(f"cannot resolve {host}: {exc.strerror}") from None
    return str(found[0][4][0])


def _executable() -> str:
    import shutil

    beside = Path(sys.executable).parent / "letsinfer"
    found = str(beside) if beside.exists() else shutil.which("letsinfer")
    if found is None:
        raise click.ClickException("the letsinfer command is not on PATH on this main")
    return found


def _main_side(ctx: CliContext) -> Any:
    from letsinfer import config
    from letsinfer.agent.runtime import advertise_address
    from letsinfer.audit.anchor import open_authority
    from letsinfer.fleet.node_add import MainSide, Peer
    from letsinfer.home import Home
    from letsinfer.trust import pki
    from letsinfer.trust.material import ClusterCA

    assert ctx.identity is not None
    settings = config.load(ctx.home.config_file)
    store = open_authority(ctx.home)
    try:
        peers = [
            Peer(n.name, n.address.rsplit(":", 1)[0].strip("[]"))
            for n in store.list_nodes()
            if n.role != "main" and n.address
        ]
    finally:
        store.close()
    return MainSide(
        name=ctx.identity.name,
        address=advertise_address(settings.control.host, settings.control.advertise),
        executable=_executable(),
        python=sys.executable,
        home="" if ctx.home == Home.system() else str(ctx.home.etc.parent),
        ca_fingerprint=pki.fingerprint(ClusterCA(ctx.home, ctx.identity).cert),
        peers=peers,
        gateway_port=settings.gateway.port,
        control_port=settings.control.port,
        agent_port=settings.agent.api_port,
    )


def add_over_ssh(ctx: CliContext, name: str | None, opts: SshOptions, as_json: bool) -> None:
    from letsinfer import __version__
    from letsinfer.cli.fleet import _extra_vars, render, summary

    if ctx.remote is not None:
        raise click.UsageError("--ssh runs on the main itself, not through a controller")
    try:
        from letsinfer.fleet import node_add
        from letsinfer.fleet.apply import FleetError
        from letsinfer.fleet.ssh_reach import SshError, SshTarget, check
    except ImportError as exc:
        raise click.ClickException(
            f"node add --ssh needs fabric and Ansible ({exc.name} is missing): "
            "pip install 'letsinfer[fleet]'"
        ) from None
    if opts.wheelhouse is not None and opts.index_url is not None:
        raise click.UsageError("give --wheelhouse or --index-url, not both")
    node = name or node_add.node_name(opts.host)
    if not node_add.NAME.match(node):
        raise click.BadParameter(
            f"{node!r}: a node name is lower-case letters, digits and '-' (63 at most)",
            param_hint="NAME",
        )
    extra = _extra_vars(opts.extra)
    playbooks = _playbooks(opts.playbooks)
    main = _main_side(ctx)
    if node == main.name:
        raise click.BadParameter(f"{node!r} is the main's own name", param_hint="NAME")
    target = SshTarget(host=_address(opts.host), user=opts.user, identity=opts.identity)

    say = (lambda text: None) if as_json else console.print
    say(f"[bold]{node}[/bold]: checking SSH to {target.where}")
    try:
        reached = check(target)
    except SshError as exc:
        raise click.ClickException(str(exc)) from None
    if reached.recorded:
        say(f"{target.host}: new host key {reached.host_key}, recorded in {target.known_hosts}")
    new = node_add.NewHost(node, target, become=reached.become, extra_vars=extra)
    wheelhouse, scratch = opts.wheelhouse, tempfile.TemporaryDirectory(prefix="letsinfer-")
    if wheelhouse is None and opts.index_url is None:
        from letsinfer.mirror.layout import MirrorLayout

        mirrored = node_add.mirror_wheelhouse(MirrorLayout.for_home(ctx.home).bundles, __version__)
        if mirrored is not None:  # an air-gapped site: the wheels its bundle brought
            say(f"installing letsinfer {__version__} from the main's mirror: {mirrored}")
            wheelhouse = node_add.packed(mirrored, Path(scratch.name))
    sources = node_add.Sources(__version__, wheelhouse, opts.index_url)
    try:
        if as_json:
            result = node_add.run(playbooks, main, new, sources)
        else:
            from rich.live import Live

            from letsinfer.fleet.apply import Progress

            with Live(render(Progress()), console=console, refresh_per_second=8) as live:
                result = node_add.run(
                    playbooks, main, new, sources, on_event=lambda p: live.update(render(p))
                )
    except FleetError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        scratch.cleanup()
    changed = node_add.changed(result)
    outcome = "failed" if not result.ok else ("onboarded" if changed else "unchanged")
    if as_json:
        failures = [{"host": h, "task": t, "message": m} for h, t, m in result.progress.failures]
        click.echo(
            json.dumps(
                {
                    "name": node,
                    "address": target.host,
                    "host_key": reached.host_key,
                    "result": outcome,
                    "changed": changed,
                    "failures": failures,
                    "warnings": [{"host": h, "message": m} for h, m in result.progress.warnings],
                }
            )
        )
    else:
        console.print(summary(result.progress))
        for host, message in result.progress.warnings:
            console.print(f"{host}: {message}", style="yellow", markup=False)
        for host, task, message in result.progress.failures:
            console.print(f"{host} {task}: {message}", style="red", markup=False)
    if not result.ok:
        raise click.ClickException(f"onboarding {node} ({target.host}) failed: see above")
    if as_json:
        return
    if changed:
        console.print(f"[green]{node}[/green] ({target.host}) is onboarded and active")
    else:
        console.print(f"{node} ({target.host}) is already a child of this cluster: nothing changed")
