"""``letsinfer node``: initialise, enroll, list, remove and move nodes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from letsinfer.authority.views import node_object, topology_objects
from letsinfer.cli import cli
from letsinfer.cli.local import ask_node, segment
from letsinfer.cli.output import console, emit, emit_object
from letsinfer.cli.remote import call
from letsinfer.cli.scope import CliContext, ScopedCommand, scoped
from letsinfer.cli.shown import read_scene, read_store

if TYPE_CHECKING:  # the commands import what each uses: a call loads only its own
    pass


@cli.group()
def node() -> None:
    """Nodes: initialise, enroll, list, pause, remove, move, disk use.

    Enrollment: `node add` on the main, `node requests` and `node accept` on the
    candidate."""


@scoped(node, "init", scope="all")
@click.option("--main", "as_main", is_flag=True, help="Make this the main node.")
@click.option("--name", help="This node's name (default: the host name).")
@click.pass_obj
def init(ctx: CliContext, as_main: bool, name: str | None) -> None:
    """Initialise this home: the main (with --main) or a candidate waiting to be enrolled."""
    from letsinfer import config
    from letsinfer.authority.bootstrap import init_candidate, init_main
    from letsinfer.trust import pki

    if as_main:
        identity, key = init_main(ctx.home, config.load(ctx.home.config_file), name=name)
        console.print(f"main node [bold]{identity.name}[/bold] ({identity.node_id}) initialised")
        click.echo(f"API key (shown once): {key}")
        return
    identity = init_candidate(ctx.home, name=name)
    fp = pki.fingerprint(pki.load_cert(ctx.home.pairing_cert.read_bytes()))
    console.print(f"candidate node [bold]{identity.name}[/bold] ({identity.node_id}) initialised")
    click.echo(f"certificate fingerprint: {fp}")
    click.echo("start it with `letsinfer up`, then run `letsinfer node add` on the main")


@scoped(node, "list", scope="main", remote="viewer")
@click.option("--all", "show_all", is_flag=True, help="Also removed nodes (kept for the record).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_nodes(ctx: CliContext, show_all: bool, as_json: bool) -> None:
    """Nodes of this cluster: state (active, paused, unreachable, down, removed)
    and when each was last heard from."""
    if ctx.remote is not None:
        rows = call(ctx.remote, "GET", f"/v1/ops/nodes?all={str(show_all).lower()}")
    else:
        store = read_store(ctx.home)
        try:
            scene = read_scene(ctx, store)
            rows = [node_object(scene, n) for n in store.list_nodes(include_removed=show_all)]
        finally:
            store.close()
    emit(
        rows,
        ["name", "id", "role", "address", "state", "last_seen"],
        as_json=as_json,
        title="nodes",
    )


@scoped(node, "info", scope="main", remote="viewer")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def info(ctx: CliContext, name: str, as_json: bool) -> None:
    """Ask a node's agent about itself, over mutual TLS."""
    if ctx.remote is not None:
        said = call(ctx.remote, "GET", f"/v1/ops/nodes/{segment(name)}/info")
        node_name, about = said["node"], said["info"]
    else:
        import asyncio

        from letsinfer.audit.anchor import open_authority
        from letsinfer.control.agent_info import InfoRefused, agent_info

        assert ctx.identity is not None
        store = open_authority(ctx.home)
        try:
            node_name, about = asyncio.run(agent_info(ctx.home, ctx.identity, store, name))
        except InfoRefused as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            store.close()
    if as_json:
        emit_object(about)
        return
    emit(
        [about],
        ["name", "node_id", "role", "version", "cpus", "memory_bytes"],
        as_json=False,
        title=node_name,
    )


@scoped(node, "remove", scope="main", remote="administrator")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def remove(ctx: CliContext, name: str, as_json: bool) -> None:
    """Remove a child: its placement groups go (their GPUs are free), the gateway
    stops routing to them, its certificate is revoked and its engines are told to
    stop. The row stays (`node list --all`); a wiped host may enroll again under
    the same name, with a new certificate."""
    import asyncio

    from letsinfer.audit.anchor import open_authority
    from letsinfer.authority import removal as removal_mod
    from letsinfer.control.removal_notice import tell_removed
    from letsinfer.trust.material import tls_files

    if ctx.remote is not None:
        done = call(ctx.remote, "POST", f"/v1/ops/nodes/{segment(name)}/remove")
    else:
        done = ask_node(ctx.home, "POST", f"/v1/local/nodes/{segment(name)}/remove")
    if done is None:  # no node runs here: write the authority, then tell the node
        assert ctx.identity is not None
        store = open_authority(ctx.home)
        try:
            try:
                removal = removal_mod.remove_node(store, name, actor="cli")
            except removal_mod.RemovalRefused as exc:
                store.append_audit("cli", "node.remove", "denied", target=name, detail=str(exc))
                raise click.ClickException(f"{exc}. Nothing changed.") from exc
            told = asyncio.run(
                tell_removed(tls_files(ctx.home, ctx.identity), removal.node, store, "cli")
            )
        finally:
            store.close()
        done = {**removal.to_json(), **told}
    if as_json:
        click.echo(json.dumps(done))
        return
    groups = ", ".join(f"{g['id']} ({g['model']})" for g in done["placement_groups"]) or "none"
    console.print(f"node {done['node']} removed; its certificate is revoked")
    click.echo(f"placement groups removed: {groups}")
    click.echo(done["notice"])


def _pause(ctx: CliContext, name: str | None, paused: bool) -> None:
    import ssl

    import httpx

    from letsinfer.audit.anchor import open_authority
    from letsinfer.authority import lifecycle
    from letsinfer.trust.client import ClusterClient, PeerMismatch
    from letsinfer.trust.material import tls_files

    ident = ctx.identity
    assert ident is not None
    word = "paused" if paused else "resumed"
    verb = "pause" if paused else "resume"
    if ident.role == "main":
        target_name = name or ident.node_id
        answer = ask_node(ctx.home, "POST", f"/v1/ops/nodes/{segment(target_name)}/{verb}")
        if answer is None:  # no node runs here: write the authority directly
            store = open_authority(ctx.home)
            try:
                target = lifecycle.find_node(store, target_name)
                lifecycle.set_node_paused(store, target, paused, actor="cli", role="main")
            finally:
                store.close()
            answer = {"node": target.name}
        console.print(
            f"node {answer['node']} {word}: "
            + ("no new requests; in-flight ones finish" if paused else "admitting")
        )
        return
    if name not in (None, ident.name, ident.node_id):
        raise click.ClickException(
            f"a child pauses only itself; run this on the main "
            f"at {ident.main_address} to pause {name}"
        )
    if ask_node(ctx.home, "POST", "/v1/local/pause", json={"paused": paused}) is not None:
        console.print(f"node {ident.name} {word} (asked the main at {ident.main_address})")
        return
    # No agent runs here: ask the main with the node's key directly.
    client = ClusterClient(tls_files(ctx.home, ident), expect_node=ident.main_id)
    try:
        resp = client.request(
            "POST", f"https://{ident.main_address}/v1/agent/pause", json={"paused": paused}
        )
    except (httpx.HTTPError, ssl.SSLError, PeerMismatch) as exc:
        raise click.ClickException(f"cannot reach the main at {ident.main_address}: {exc}") from exc
    if resp.status_code != 200:
        raise click.ClickException(f"the main refused: {resp.text}")
    console.print(f"node {ident.name} {word} (asked the main at {ident.main_address})")


@scoped(node, "pause", scope="all")
@click.argument("name", required=False)
@click.pass_obj
def pause(ctx: CliContext, name: str | None) -> None:
    """Stop new admission on a node (this one by default); in-flight work finishes,
    engines keep running. On a child this asks the main over mutual TLS."""
    _pause(ctx, name, True)


@scoped(node, "resume", scope="all")
@click.argument("name", required=False)
@click.pass_obj
def resume(ctx: CliContext, name: str | None) -> None:
    """Admit new requests on a paused node again."""
    _pause(ctx, name, False)


@cli.command("topology", cls=ScopedCommand, scope="main", remote="viewer")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def topology(ctx: CliContext, as_json: bool) -> None:
    """Nodes, their GPUs, the placement groups on them and their data links."""
    if ctx.remote is not None:
        out = call(ctx.remote, "GET", "/v1/ops/topology")
    else:
        store = read_store(ctx.home)
        try:
            out = topology_objects(store, read_scene(ctx, store))
        finally:
            store.close()
    if as_json:
        emit(out, [], as_json=True)
        return
    from rich.markup import escape
    from rich.tree import Tree

    tree = Tree("cluster")
    for n in out:
        branch = tree.add(
            f"[bold]{escape(n['name'])}[/bold] ({n['role']}, {n['state']}) targets: "
            f"{', '.join(n['targets']) or '?'}"
        )
        for g in n["gpus"]:
            branch.add(f"GPU {g['uuid']} {g['name']} → {g['placement_group'] or 'free'}")
        for pg in n["placement_groups"]:
            why = f": {pg['detail']}" if pg["state"] in ("parked", "failed") else ""
            branch.add(escape(f"{pg['id']} {pg['model']} [{pg['state']}]{why}"))
        for link in n["links"]:
            branch.add(escape(f"data link → {link['peer']} [{link['state']}]"))
    console.print(tree)
