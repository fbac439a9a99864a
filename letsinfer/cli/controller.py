"""Controllers: ``auth controller add/list/revoke`` on the main, and on an
operator's workstation ``controller pair`` plus the typed operations."""

from __future__ import annotations

import json
import ssl
from typing import Any

import click
import httpx

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority import controllers
from letsinfer.cli import cli, remote
from letsinfer.cli.auth import auth
from letsinfer.cli.local import segment
from letsinfer.cli.output import console, emit
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.trust import pki
from letsinfer.trust.client import PeerMismatch, peer_certificate


@auth.group("controller")
def auth_controller() -> None:
    """Controllers (operator workstations) and their roles."""


@scoped(auth_controller, "add", scope="main", remote="administrator")
@click.option(
    "--role",
    required=True,
    type=click.Choice(list(controllers.ROLE_RANK)),
    metavar="ROLE",
    help="viewer (reads state), operator (lifecycle too) or administrator (keys, nodes too).",
)
@click.option(
    "--name",
    default="controller",
    show_default=True,
    help="What the controller is called in `auth controller list` and the audit chain "
    "(unique among the controllers not revoked).",
)
@click.pass_obj
def controller_add(ctx: CliContext, role: str, name: str) -> None:
    """Create a one-time pairing code for a new controller.

    From a controller, the main makes the code and it is printed here; the
    new workstation pairs with the main as with a code made there."""
    if ctx.remote is not None:
        made = remote.call(ctx.remote, "POST", "/v1/ops/controllers", {"name": name, "role": role})
        code, comparison, ttl_s = made["code"], made["comparison"], made["ttl_s"]
    else:
        assert ctx.identity is not None and ctx.identity.cluster is not None
        ttl_s = config.load(ctx.home.config_file).control.pairing_code_ttl_s
        store = open_authority(ctx.home)
        try:
            pairing = controllers.new_pairing(store, ctx.identity.cluster, role, name, ttl_s)
        finally:
            store.close()
        code, comparison = pairing.code, pairing.comparison
    console.print(
        f"pairing code for controller [bold]{name}[/bold] ({role}), valid {ttl_s / 60:.0f} min:"
    )
    click.echo(f"code: {code}")
    click.echo(f"comparison: {comparison}")
    click.echo(
        "on the workstation: letsinfer controller pair --main HOST:PORT --code CODE; "
        "check it shows the same comparison string"
    )


@scoped(auth_controller, "list", scope="main", remote="viewer")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def controller_list(ctx: CliContext, as_json: bool) -> None:
    """Controllers with their role and state."""
    if ctx.remote is not None:
        from letsinfer.cli.remote import call

        rows = call(ctx.remote, "GET", "/v1/ops/controllers")
    else:
        from letsinfer.authority.controllers import listed

        store = open_authority(ctx.home)
        try:
            rows = listed(store)
        finally:
            store.close()
    emit(rows, ["name", "id", "role", "state"], as_json=as_json, title="controllers")


@scoped(auth_controller, "revoke", scope="main", remote="administrator")
@click.argument("name")
@click.pass_obj
def controller_revoke(ctx: CliContext, name: str) -> None:
    """Revoke a controller: its certificate is refused from now on.

    A controller does not revoke itself: revoke it from another
    administrator's controller or from a shell on the main."""
    if ctx.remote is not None:
        revoked = remote.call(ctx.remote, "POST", "/v1/ops/controllers/revoke", {"name": name})
        shown = revoked["name"]
    else:
        store = open_authority(ctx.home)
        try:
            shown = controllers.revoke(store, name).name
        finally:
            store.close()
    console.print(f"controller {shown} revoked")


# -- the workstation side ------------------------------------------------------


@cli.group()
def controller() -> None:
    """Act as a paired controller from this workstation."""


@scoped(controller, "pair", scope="all")
@click.option(
    "--main",
    "main_address",
    required=True,
    metavar="HOST:PORT",
    help="The main's control-plane address (port 8443 by default).",
)
@click.option("--code", required=True, help="The one-time code from `auth controller add`.")
@click.option(
    "--expect",
    metavar="STRING",
    help="The comparison string the main showed; pairing stops if it differs.",
)
@click.option("--yes", is_flag=True, help="Do not ask to confirm the comparison string.")
@click.option(
    "--name",
    default=remote.DEFAULT,
    show_default=True,
    help="What this workstation calls the paired main: `controller use NAME` and "
    "--controller NAME select it. Pair with several mains (or roles) under several names.",
)
@click.pass_obj
def pair(
    ctx: CliContext, main_address: str, code: str, expect: str | None, yes: bool, name: str
) -> None:
    """Pair with a main: make a key here (never exported), get a role certificate."""
    files = remote.pairing_named(ctx.home, name)
    key = pki.read_private_key(files.key) if files.key.exists() else pki.new_key()
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE  # the CA is checked below, by a person
    try:
        with httpx.Client(verify=probe, timeout=15) as client:
            resp = client.get(f"https://{main_address}/v1/pair/ca")
            server_der = peer_certificate(resp)
        ca_pem = resp.json()["ca"]
        ca = pki.load_cert(ca_pem.encode())
        pki.verify_issued_by(pki.load_cert(server_der), ca)
    except (httpx.HTTPError, PeerMismatch, ValueError, KeyError, pki.CertificateError) as exc:
        raise click.ClickException(f"{main_address} is not a letsinfer main: {exc}") from exc
    comparison = controllers.comparison_string(pki.fingerprint(ca), code)
    click.echo(f"comparison: {comparison}")
    # The code is sent only after the person (or --expect) confirmed the CA.
    if expect is not None and expect != comparison:
        raise click.ClickException(
            "comparison strings differ: this is not your main; the code was not sent"
        )
    if (
        expect is None
        and not yes
        and not click.confirm("Does the main show the same comparison string?")
    ):
        raise click.ClickException("not confirmed; the code was not sent")
    trusted = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    trusted.check_hostname = False
    trusted.load_verify_locations(cadata=ca_pem)
    body = {"code": code, "csr": pki.make_csr(key, "controller").decode()}
    try:
        resp = httpx.post(
            f"https://{main_address}/v1/pair/controller", json=body, verify=trusted, timeout=15
        )
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the main at {main_address}: {exc}") from exc
    if resp.status_code != 200:
        raise click.ClickException("the main refused: " + resp.json()["error"]["message"])
    answer = resp.json()
    cert = pki.load_cert(answer["certificate"].encode())
    pki.verify_issued_by(cert, ca)
    files.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    pki.write_private_key(files.key, key)
    pki.write_pem(files.ca, ca_pem.encode())
    pki.write_pem(files.cert, answer["certificate"].encode())
    files.meta.write_text(
        json.dumps(
            {
                "main": main_address,
                "main_id": answer["main_id"],
                "controller_id": answer["controller_id"],
                "role": answer["role"],
            }
        )
    )
    console.print(
        f"paired with {main_address} as [bold]{answer['role']}[/bold]"
        + ("" if name == remote.DEFAULT else f" (controller {name})")
    )


def _call(ctx: CliContext, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """The selected main (else the pairing made without a name) answers."""
    pairing = remote.selected(ctx.home, ctx.controller) or remote.pairing_named(
        ctx.home, remote.DEFAULT
    )
    if not pairing.meta.exists():
        raise click.ClickException("this workstation is not paired: `letsinfer controller pair`")
    data: dict[str, Any] = remote.call(pairing, method, path, body, timeout=15)
    return data


@scoped(controller, "list", scope="all")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_pairings(ctx: CliContext, as_json: bool) -> None:
    """The mains this workstation is paired with, each with its role; ``selected``:
    the one commands run on (`controller use`, --controller, LETSINFER_CONTROLLER)."""
    chosen = remote.selected_name(ctx.home, ctx.controller)
    rows = [
        {
            "name": p.name,
            "main": p.main,
            "role": p.role,
            "main_id": p.said().get("main_id"),
            "selected": p.name == chosen,
        }
        for p in remote.pairings(ctx.home)
    ]
    emit(rows, ["name", "main", "role", "selected"], as_json=as_json, title="paired mains")


@scoped(controller, "use", scope="all")
@click.argument("name", required=False)
@click.option(
    "--clear", is_flag=True, help="Select none: commands run here, on this machine's node."
)
@click.pass_obj
def use(ctx: CliContext, name: str | None, clear: bool) -> None:
    """Select the paired main NAME: from now on commands that have an operation in
    its admin API run there, as if typed on it (a kubectl context). --controller
    NAME or LETSINFER_CONTROLLER overrides it for one command."""
    chosen = remote.use_file(ctx.home)
    if clear == (name is not None):
        raise click.UsageError("give a NAME (`letsinfer controller list`) or --clear")
    if clear:
        chosen.unlink(missing_ok=True)
        console.print("no controller selected: commands run on this machine")
        return
    assert name is not None
    pairing = remote.pairing_named(ctx.home, name)
    if not pairing.meta.is_file():
        known = ", ".join(p.name for p in remote.pairings(ctx.home)) or "none"
        raise click.ClickException(f"no main paired as {name!r} here (paired: {known})")
    chosen.write_text(name + "\n")
    console.print(
        f"commands now run on {pairing.main} as controller {name} ({pairing.role})",
        highlight=False,
    )


@scoped(controller, "state", scope="all")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def state(ctx: CliContext, as_json: bool) -> None:
    """Nodes, models and placement groups (viewer)."""
    data = _call(ctx, "GET", "/v1/ops/state")
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    emit(data["nodes"], ["name", "role", "state"], as_json=False, title="nodes")
    emit(
        data["placement_groups"],
        ["id", "model", "desired", "state"],
        as_json=False,
        title="placement groups",
    )


@controller.group("model")
def controller_model() -> None:
    """Model lifecycle (operator)."""


@scoped(controller_model, "stop", scope="all")
@click.argument("name")
@click.pass_obj
def model_stop(ctx: CliContext, name: str) -> None:
    """Stop a model's placement groups (operator)."""
    data = _call(ctx, "POST", f"/v1/ops/models/{segment(name)}/stop")
    console.print(f"model {data['model']}: {data['placement_groups']} placement group(s) stopping")


@scoped(controller_model, "start", scope="all")
@click.argument("name")
@click.pass_obj
def model_start(ctx: CliContext, name: str) -> None:
    """Start a model's placement groups (operator)."""
    data = _call(ctx, "POST", f"/v1/ops/models/{segment(name)}/start")
    console.print(f"model {data['model']}: {data['placement_groups']} placement group(s) starting")


@controller.group("key")
def controller_key() -> None:
    """API keys (administrator)."""


@scoped(controller_key, "create", scope="all")
@click.argument("name")
@click.option(
    "--model",
    "models",
    multiple=True,
    help="Allow only this model (name or alias); repeat for more. Default: all.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    help="At most this many requests at once with this key.",
)
@click.pass_obj
def key_create(
    ctx: CliContext, name: str, models: tuple[str, ...], concurrency: int | None
) -> None:
    """Create an API key through the main (administrator)."""
    data = _call(
        ctx,
        "POST",
        "/v1/ops/keys",
        {"name": name, "models": list(models), "concurrency": concurrency},
    )
    click.echo(data["key"])
