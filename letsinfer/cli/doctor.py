"""``letsinfer doctor``: this machine's fitness, or (``--cluster``, on the main)
the cluster's invariants. Exit 1 when anything fails.

With a controller selected, ``--cluster`` runs on that main (the admin API's
findings, printed here as there); plain ``doctor`` still checks the machine it
runs on and sends nothing."""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import click
from rich.markup import escape

from letsinfer.cli import cli
from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext, require_scope, scoped
from letsinfer.doctor.findings import Finding, report

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


@scoped(cli, "doctor", scope="all", remote="viewer", remote_with="cluster")
@click.option(
    "--cluster",
    is_flag=True,
    help="Check the cluster's invariants (on the main, or a controller's main).",
)
@click.option(
    "--ntp",
    metavar="HOST[:PORT]",
    help="Compare this clock with an NTP server (a child compares with its main anyway).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: host, ok, findings.")
@click.pass_obj
def doctor(ctx: CliContext, cluster: bool, ntp: str | None, as_json: bool) -> None:
    """Check this machine before (and after) letsinfer runs on it: Python and
    the engine runtime, GPUs through NVML (driver, memory, ECC errors,
    temperature, MIG), open-file and locked-memory limits, free disk under the
    home, the clock against the main (or --ntp), the node's ports, mDNS, the
    firewall table and the certificates. Each finding has a level (ok, warn,
    fail) and a one-line fix; exit 1 on any failure.

    With --cluster (on the main): every invariant of the design across the
    cluster: one main, each GPU in at most one placement group, certificates
    valid and not near expiry, facts fresh, audit heads as witnessed, the
    firewall on every member, and every group meant to run ready or its reason.

    --json prints one object: host, ok, failures, warnings, and findings
    (each with check, level, message and fix).
    """
    if cluster and ctx.remote is not None:
        from letsinfer.cli.remote import call

        found = call(ctx.remote, "GET", "/v1/ops/doctor/cluster")
    else:
        if cluster:
            require_scope(ctx, "main", "letsinfer doctor --cluster")
            findings = _cluster(ctx)
        else:
            from letsinfer.doctor.host import check_host
            from letsinfer.doctor.node import plan_for

            findings = check_host(plan_for(ctx.home, ctx.identity, ntp))
        found = report(ctx.identity.name if ctx.identity else socket.gethostname(), findings)
    if as_json:
        json.dump(found, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print(found, cluster)
    if not found["ok"]:
        sys.exit(1)


def _cluster(ctx: CliContext) -> list[Finding]:
    from letsinfer import config
    from letsinfer.audit.anchor import open_authority
    from letsinfer.doctor.cluster import check_main

    assert ctx.identity is not None
    settings = config.load(ctx.home.config_file)
    store = open_authority(ctx.home)
    try:
        return check_main(ctx.home, ctx.identity, store, settings.control.node_stale_after_s)
    finally:
        store.close()


def _print(found: dict[str, Any], cluster: bool) -> None:
    """``found``: the report (letsinfer.doctor.findings.report), made here or on the main."""
    for f in found["findings"]:
        style = _STYLE[f["level"]]
        line = (
            f"[{style}]{f['level'].upper():4}[/{style}] {escape(f['check'])}: "
            f"{escape(f['message'])}"
        )
        if f["fix"]:
            line += f"\n     [dim]fix: {escape(f['fix'])}[/dim]"
        console.print(line, highlight=False, soft_wrap=True)
    failed, warned = found["failures"], found["warnings"]
    what = "the cluster" if cluster else found["host"]
    if failed:
        console.print(f"[bold red]{failed} failure(s)[/bold red], {warned} warning(s) on {what}")
    else:
        console.print(f"[green]{what}: no failures[/green] ({warned} warning(s))")
