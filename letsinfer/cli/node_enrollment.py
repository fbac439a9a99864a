"""Enrollment: `letsinfer node add` on the main sends a candidate a request
signed by the main's node key; `node requests`, `node accept` and `node
reject` on the candidate show and answer it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from letsinfer.authority.views import when
from letsinfer.cli.local import node_runs_here
from letsinfer.cli.node import node
from letsinfer.cli.output import console, emit
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.identity import load_identity

if TYPE_CHECKING:  # the commands import what each uses: a call loads only its own
    from letsinfer import config
    from letsinfer.store import AuthorityStore
    from letsinfer.trust.discovery import Advert


def _candidates(wait: float) -> list[Advert]:
    from letsinfer.trust.discovery import browse

    return [a for a in browse(wait) if a.role == "candidate" and a.pairing == "open"]


@scoped(node, "add", scope="main", remote="administrator")
@click.argument("name", required=False)
@click.option("--address", metavar="HOST:PORT", help="Reach the candidate here (agent port).")
@click.option(
    "--fingerprint",
    metavar="SHA256",
    help="The candidate's certificate fingerprint (from its `letsinfer status`), "
    "when it is not discovered over mDNS.",
)
@click.option("--wait", default=2.0, show_default=True, help="Seconds to listen for mDNS.")
@click.option(
    "--code",
    "join_code",
    is_flag=True,
    help="Print a one-time join code instead: `letsinfer join` on the new machine enrolls it.",
)
@click.option(
    "--ttl", default="15m", show_default=True, help="How long a --code stays valid (30s, 15m, 1h)."
)
@click.option(
    "--ssh",
    "ssh_host",
    metavar="HOST",
    help="Onboard HOST over SSH: doctor, firewall, install, service, enrollment (as site.yml).",
)
@click.option("--user", default="root", show_default=True, help="The SSH account (--ssh).")
@click.option(
    "--identity",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The SSH private key (--ssh); default: the user's keys.",
)
@click.option(
    "--wheelhouse",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Install letsinfer on HOST from this archive of wheels only (--ssh); default: the "
    "newest bundle in the main's mirror holding this version, else pip's index.",
)
@click.option("--index-url", metavar="URL", help="Install from this package index (--ssh).")
@click.option(
    "--playbooks",
    type=click.Path(path_type=Path, file_okay=False),
    help="The collection's playbooks folder (--ssh); default: ./playbooks or the checkout's.",
)
@click.option(
    "-e", "--extra-vars", "extra", multiple=True, help="KEY=VALUE or JSON for the roles (--ssh)."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def add(
    ctx: CliContext,
    name: str | None,
    address: str | None,
    fingerprint: str | None,
    wait: float,
    join_code: bool,
    ttl: str,
    ssh_host: str | None,
    user: str,
    identity: Path | None,
    wheelhouse: Path | None,
    index_url: str | None,
    playbooks: Path | None,
    extra: tuple[str, ...],
    as_json: bool,
) -> None:
    """Without arguments, list discovered candidates; with NAME or --address, send
    an enrollment request pinned to the candidate's certificate fingerprint.
    With --code, print a one-time join code for `letsinfer join` on the new machine.
    With --ssh HOST, onboard that machine over SSH with the node_add.yml playbook
    (site.yml's steps for one host) and wait until it is an active child (NAME
    names it; default: HOST's first label).

    From a paired controller only --code runs (on the main: the code printed
    here enrolls the new machine with it); --ssh, NAME and --address reach
    machines from the main's own network and keys, and run only there."""
    ssh_only = {
        "--wheelhouse": wheelhouse,
        "--index-url": index_url,
        "--identity": identity,
        "--playbooks": playbooks,
        "-e": extra,
    }
    if ssh_host is None and (user != "root" or any(ssh_only.values())):
        given = [k for k, v in ssh_only.items() if v] or ["--user"]
        raise click.UsageError(f"{', '.join(given)} only go with --ssh HOST")
    if ctx.remote is not None and (ssh_host is not None or not join_code):
        from letsinfer.cli.remote import main_only

        raise main_only(
            ctx.remote,
            "node add --ssh" if ssh_host is not None else "node add",
            "it reaches the new machine from the main's own network"
            + (" with the main's SSH keys and playbooks" if ssh_host is not None else "")
            + "; from a controller, `letsinfer node add --code` makes a join code instead",
        )
    if ssh_host is not None:
        if join_code or address or fingerprint:
            raise click.UsageError("--ssh takes no --code, --address or --fingerprint")
        from letsinfer.cli.node_ssh import SshOptions, add_over_ssh

        opts = SshOptions(ssh_host, user, identity, wheelhouse, index_url, playbooks, extra)
        add_over_ssh(ctx, name, opts, as_json)
        return
    if join_code:
        _join_code(ctx, name, address, fingerprint, ttl, as_json)
        return
    from letsinfer import config
    from letsinfer.audit.anchor import open_authority
    from letsinfer.audit.denials import record_denial
    from letsinfer.authority import enrollment
    from letsinfer.trust import pki
    from letsinfer.trust.material import ClusterCA

    assert ctx.identity is not None
    settings = config.load(ctx.home.config_file)
    found: list[Advert] = [] if (address and fingerprint) else _candidates(wait)
    if name is None and address is None:
        rows = [
            {
                "name": a.label,
                "node_id": a.node_id,
                "address": a.address(),
                "fingerprint": a.fingerprint,
            }
            for a in found
        ]
        emit(
            rows,
            ["name", "node_id", "address", "fingerprint"],
            as_json=as_json,
            title="candidates (enroll one with `letsinfer node add NAME`)",
        )
        return
    match = [
        a
        for a in found
        if name in (a.name, a.label, a.node_id) or (address is not None and address == a.address())
    ]
    if fingerprint is None:
        if not match:
            raise click.ClickException(
                f"no candidate {name or address} advertises itself here; pass --address "
                "HOST:PORT and --fingerprint (shown by `letsinfer status` on the candidate)"
            )
        fingerprint = match[0].fingerprint
    target = address or match[0].address()
    try:
        _, who, der = _pinned(target, "GET", "/v1/identity", None, fingerprint, settings)
    except PinMismatchRefused:
        store = open_authority(ctx.home)
        try:
            record_denial(
                store,
                f"peer:{target}",
                "node.add",
                "presented another certificate than the pinned fingerprint",
                settings.audit.denial_interval_s,
            )
        finally:
            store.close()
        raise
    cand_id, cand_name = who["node_id"], who["name"]
    pubkey = pki.public_key_fingerprint(pki.load_cert(der))
    store = open_authority(ctx.home)
    try:
        offer = enrollment.open_offer(
            store, cand_id, name or cand_name, target, pubkey, settings.control.enrollment_ttl_s
        )
        ca = ClusterCA(ctx.home, ctx.identity)
        body = {
            "enrollment_id": offer.record.id,
            "main_id": ctx.identity.node_id,
            "main_name": ctx.identity.name,
            "main_address": _control_address(settings),
            "ca": ca.pem,
            "token": offer.token,
            "expires_at": offer.record.expires_at,
            "gateway_url": None,
        }
        body |= _proof(ctx, body, cand_id)
        try:
            status, answer, _ = _pinned(
                target, "POST", "/v1/enroll/request", body, fingerprint, settings
            )
        except click.ClickException as exc:
            enrollment.close_offer(store, offer.record.id, "refused", exc.message)
            raise
        if status != 200:
            why = answer.get("error", {}).get("message", f"HTTP {status}")
            enrollment.close_offer(store, offer.record.id, "refused", why)
            raise click.ClickException(f"the candidate refused: {why}")
    finally:
        store.close()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "id": offer.record.id,
                    "name": offer.record.name,
                    "node_id": cand_id,
                    "address": target,
                    "fingerprint": fingerprint,
                    "expires_at": when(offer.record.expires_at),
                    "accept": f"letsinfer node accept {offer.record.id}",
                }
            )
        )
        return
    console.print(
        f"enrollment request [bold]{offer.record.id}[/bold] sent to {offer.record.name} at {target}"
    )
    click.echo(f"on that node, run: letsinfer node accept {offer.record.id}")


def _join_code(
    ctx: CliContext,
    name: str | None,
    address: str | None,
    fingerprint: str | None,
    ttl: str,
    as_json: bool,
) -> None:
    from letsinfer import config
    from letsinfer.audit.anchor import open_authority
    from letsinfer.authority import joining
    from letsinfer.capacity.policy import PolicyError, parse_duration

    if name or address or fingerprint:
        raise click.UsageError("--code takes no NAME, --address or --fingerprint")
    try:
        ttl_s = parse_duration(ttl, "--ttl")
    except PolicyError as exc:
        raise click.BadParameter(str(exc), param_hint="--ttl") from exc
    if not 0 < ttl_s <= joining.MAX_TTL_S:
        raise click.BadParameter("a join code lives between 1s and 7d", param_hint="--ttl")
    if ctx.remote is not None:
        from letsinfer.cli.remote import call

        issued = call(ctx.remote, "POST", "/v1/ops/join-codes", {"ttl_s": ttl_s})
    else:
        assert ctx.identity is not None and ctx.identity.cluster is not None
        settings = config.load(ctx.home.config_file)
        store = open_authority(ctx.home)
        try:
            issued = joining.join_code_issued(
                store, ctx.identity.cluster, ttl_s, _control_address(settings)
            )
        finally:
            store.close()
    if as_json:
        click.echo(json.dumps({**issued, "expires_at": when(issued["expires_at"])}))
        return
    click.echo(f"join code (works once, until {when(issued['expires_at'])}): {issued['code']}")
    click.echo(f"on the new machine, run: {issued['join']}")


def _proof(ctx: CliContext, body: dict[str, Any], candidate_id: str) -> dict[str, str]:
    """The main's node certificate and its key's signature over ``body`` for
    ``candidate_id``: what lets the candidate tell this request from one a LAN
    host made with the (public) CA certificate."""
    from letsinfer.trust import request_proof
    from letsinfer.trust.material import ensure_node_key, tls_files

    assert ctx.identity is not None
    signed = request_proof.message(
        enrollment_id=body["enrollment_id"],
        candidate_id=candidate_id,
        main_id=body["main_id"],
        main_name=body["main_name"],
        main_address=body["main_address"],
        ca_pem=body["ca"],
        token=body["token"],
        expires_at=body["expires_at"],
        gateway_url=body["gateway_url"],
    )
    return {
        "main_cert": tls_files(ctx.home, ctx.identity).cert.read_text(),
        "signature": request_proof.sign(ensure_node_key(ctx.home), signed),
    }


def _control_address(settings: config.Settings) -> str:
    from letsinfer.agent.runtime import advertise_address

    control = settings.control
    return f"{advertise_address(control.host, control.advertise)}:{control.port}"


def _pinned(
    target: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    fp: str,
    settings: config.Settings,
) -> tuple[int, dict[str, Any], bytes]:
    from letsinfer.trust.pinning import PeerUnreachable, PinMismatch, pinned_request

    try:
        return pinned_request(target, settings.agent.api_port, method, path, body, fp)
    except PinMismatch as exc:
        raise PinMismatchRefused(str(exc)) from exc
    except (PeerUnreachable, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


class PinMismatchRefused(click.ClickException):
    """The peer presented another certificate than the one pinned (audited)."""


@scoped(node, "requests", scope="all")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def requests(ctx: CliContext, as_json: bool) -> None:
    """Enrollment requests this node has received, each with the fingerprint of the
    requesting main's cluster CA: compare it with the main's `letsinfer status`
    before `node accept ID --ca-fingerprint SHA256`. Each was signed by the key
    of a main of that CA (one that was not is never kept); the name and main
    address are that main's own words, `from` the address it came from. A node
    in a cluster receives one only while `node move-into` allows it."""
    from letsinfer.trust import candidate

    rows = [
        {
            "id": r.id,
            "ca_fingerprint": r.ca_fingerprint,
            "main_id": r.main_id,
            "main": r.main_name,
            "main_address": r.main_address,
            "from": r.received_from,
            "expires": when(r.keep_until),
        }
        for r in candidate.list_requests(ctx.home, _candidate_id(ctx))
    ]
    emit(
        rows,
        ["id", "ca_fingerprint", "main_id", "main", "main_address", "from", "expires"],
        as_json=as_json,
        title="enrollment requests",
    )


def _candidate_id(ctx: CliContext) -> str:
    """This node's id, which a request must be signed for (none: no request is)."""
    return ctx.identity.node_id if ctx.identity is not None else ""


def _refuse_move(ctx: CliContext, store: AuthorityStore, action: str, target: str) -> str | None:
    """Refuse (audited, exit 1) while active work or children block leaving this
    cluster; otherwise the note to show when the main could not be asked."""
    from letsinfer.cli.adoption import move_blockers

    blockers, note = move_blockers(ctx)
    if blockers:
        why = "; ".join(blockers)
        store.append_audit("cli", action, "denied", target=target, detail=why)
        raise click.ClickException(f"cannot move this node: {why}. Nothing changed.")
    return note


def _fingerprint_option(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    from letsinfer.trust import pki

    if value is None:
        return None
    try:
        return pki.normalize_fingerprint(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@scoped(node, "accept", scope="all")
@click.argument("request_id")
@click.option(
    "--ca-fingerprint",
    metavar="SHA256",
    callback=_fingerprint_option,
    help="Accept only if the request comes from the cluster whose CA has this "
    "fingerprint (`ca_fingerprint` in the main's `letsinfer status --json`).",
)
@click.pass_obj
def accept(ctx: CliContext, request_id: str, ca_fingerprint: str | None) -> None:
    """Accept an enrollment request: send a CSR and join the main's cluster.

    With --ca-fingerprint, a request from any other cluster is refused (and
    audited) and nothing changes. Either way the main reached must present a
    certificate issued by the request's CA for the request's main id. On a node
    already in a cluster (after `node move-into`) this is the move; on a main,
    its own authority is retired in the same step (see docs/architecture.md)."""
    from letsinfer import config
    from letsinfer.audit.anchor import open_authority
    from letsinfer.authority import retirement
    from letsinfer.trust import candidate

    if ctx.identity is None:
        raise click.ClickException("this home is not a node yet: run `letsinfer node init`")
    req = candidate.get_request(ctx.home, request_id, ctx.identity.node_id)
    was_main = ctx.identity.role == "main"
    store = open_authority(ctx.home)
    note = None
    try:
        if ca_fingerprint is not None:
            try:
                candidate.check_cluster(req, ca_fingerprint)
            except candidate.EnrollmentError as exc:
                store.append_audit(
                    "cli", "node.accept", "denied", target=req.main_name, detail=str(exc)
                )
                raise click.ClickException(str(exc)) from exc
        if ctx.identity.enrolled:
            note = _refuse_move(ctx, store, "node.move", req.main_name)
        settings = config.load(ctx.home.config_file)
        from letsinfer.agent.runtime import advertise_address

        agent = settings.agent
        address = f"{advertise_address(agent.api_host, agent.advertise)}:{agent.api_port}"
        if was_main:
            resting = retirement.prepare(ctx.home, ctx.identity)
        try:
            moved = candidate.accept(ctx.home, ctx.identity, req, address)
        except candidate.EnrollmentError as exc:
            if was_main:
                retirement.abandon(ctx.home)
            store.append_audit(
                "cli", "node.accept", "denied", target=req.main_name, detail=str(exc)
            )
            raise click.ClickException(str(exc)) from exc
        store.append_audit(
            "cli",
            "node.accept",
            "ok",
            role="child",
            target=req.main_name,
            detail=f"cluster sha256:{moved.cluster}"
            + (f"; this main's authority retires to {resting}" if was_main else "")
            + (f"; {note}" if note else ""),
        )
    finally:
        store.close()
    if note:
        click.echo(f"note: {note}")
    (ctx.home.move_window).unlink(missing_ok=True)
    if was_main:
        _finish_retirement(ctx)
    console.print(
        f"this node is now a child of [bold]{req.main_name}[/bold] "
        f"({req.main_address}); a running node switches within a second"
    )


def _finish_retirement(ctx: CliContext) -> None:
    """Here when no node runs; else the running node does it as it stops its
    main planes (it holds the database open): wait for that."""
    from letsinfer.authority import retirement

    if not node_runs_here(ctx.home):
        resting = retirement.complete(ctx.home)
        click.echo(f"the former authority is retired to {resting}")
        return
    deadline = time.monotonic() + 60
    while retirement.pending(ctx.home) and time.monotonic() < deadline:
        time.sleep(0.2)
    if retirement.pending(ctx.home):
        click.echo("the running node retires the former authority as it restarts as an agent")
    else:
        click.echo("the running node retired the former authority and runs as an agent now")


@scoped(node, "reject", scope="all")
@click.argument("request_id")
@click.pass_obj
def reject(ctx: CliContext, request_id: str) -> None:
    """Reject (drop) an enrollment request."""
    from letsinfer.audit.anchor import open_authority
    from letsinfer.trust import candidate

    req = candidate.get_request(ctx.home, request_id, _candidate_id(ctx))
    candidate.drop_request(ctx.home, req.id)
    store = open_authority(ctx.home)
    try:
        store.append_audit(
            "cli",
            "node.reject",
            "ok",
            target=req.main_name,
            detail=f"{req.id} from {req.received_from or '?'} (main address "
            f"{req.main_address}), cluster CA sha256:{req.ca_fingerprint}",
        )
    finally:
        store.close()
    console.print(f"enrollment request {req.id} from {req.main_name} rejected")


@scoped(node, "move-into", scope="all")
@click.option(
    "--main",
    "main_address",
    required=True,
    metavar="HOST:PORT",
    help="The control address of the main this node should move to.",
)
@click.option(
    "--window",
    default=900.0,
    show_default=True,
    help="Seconds during which that main's enrollment request is accepted.",
)
@click.pass_obj
def move_into(ctx: CliContext, main_address: str, window: float) -> None:
    """Allow this enrolled node to be adopted by another main (explicitly, for a while).

    Refused while the node has active placement groups or attached children. The
    move itself happens at `letsinfer node accept`: models and caches stay;
    authority, certificates, controllers, keys and service state are replaced.
    """
    from letsinfer.agent.api import adoption_window
    from letsinfer.audit.anchor import open_authority

    ident = load_identity(ctx.home.identity_file)
    if ident is None or not ident.enrolled:
        raise click.ClickException("this node is not in a cluster; use `node accept` directly")
    store = open_authority(ctx.home)
    try:
        note = _refuse_move(ctx, store, "node.move-into", main_address)
        ctx.home.enrollment_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (ctx.home.move_window).write_text(
            json.dumps({"main": main_address, "until": time.time() + window})
        )
        store.append_audit("cli", "node.move-into", "ok", target=main_address, detail=note)
    finally:
        store.close()
    assert adoption_window(ctx.home) is not None
    if note:
        click.echo(f"note: {note}")
    console.print(
        f"this node accepts an enrollment request from {main_address} for the next "
        f"{window:.0f}s; then run `letsinfer node accept ID` here"
        + ("; this main's authority is retired then" if ident.role == "main" else "")
    )
