"""``letsinfer model``: the model services this cluster serves."""

from __future__ import annotations

from pathlib import Path

import click

from letsinfer import config
from letsinfer.authority.models import add_gguf_model
from letsinfer.cli import cli
from letsinfer.cli.output import console, emit
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.engines import releases
from letsinfer.store import AuthorityStore


@cli.group()
def model() -> None:
    """Model services: list and add."""


@scoped(model, "list", scope="main")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_models(ctx: CliContext, as_json: bool) -> None:
    """List model services with their placement groups."""
    store = AuthorityStore(ctx.home.database)
    try:
        rows = []
        for svc in store.list_services():
            pgs = store.list_placement_groups(service=svc.name)
            rows.append(
                {
                    "name": svc.name,
                    "aliases": list(svc.aliases),
                    "format": svc.format,
                    "sha256": svc.artifact_digest,
                    "size": svc.artifact_size,
                    "placement_groups": [
                        {"id": p.id, "node": p.node_id, "state": p.state} for p in pgs
                    ],
                    "ready": sum(p.state == "ready" for p in pgs),
                    "total": len(pgs),
                }
            )
    finally:
        store.close()
    if as_json:
        emit(rows, [], as_json=True)
        return
    table = [
        {
            **r,
            "aliases": ", ".join(r["aliases"]),
            "sha256": r["sha256"][:12],
            "size": f"{r['size'] / 1e6:.1f} MB",
            "ready": f"{r['ready']}/{r['total']}",
        }
        for r in rows
    ]
    emit(
        table,
        ["name", "aliases", "format", "size", "sha256", "ready"],
        as_json=False,
        title="models",
    )


@scoped(model, "add", scope="main")
@click.argument("name")
@click.option(
    "--gguf",
    "gguf_path",
    required=True,
    type=click.Path(path_type=Path),
    help="A local GGUF file; it is checked and copied into the model store.",
)
@click.option("--alias", "aliases", multiple=True, help="Another name clients may use.")
@click.option(
    "--engine",
    type=click.Choice(["xllamacpp", "llama-server"]),
    help="Engine to run it (default: the node's configured engine).",
)
@click.pass_obj
def add_model(
    ctx: CliContext, name: str, gguf_path: Path, aliases: tuple[str, ...], engine: str | None
) -> None:
    """Add a model from a local GGUF file and serve it on this node."""
    assert ctx.identity is not None  # the scope check guarantees an identity
    settings = config.load(ctx.home.config_file)
    release = releases.for_engine_kind(
        engine or settings.engine.kind, settings.engine.llama_server_binary
    )
    store = AuthorityStore(ctx.home.database)
    try:
        svc, pg = add_gguf_model(
            store,
            ctx.home.model_store,
            name,
            gguf_path.expanduser(),
            node_id=ctx.identity.node_id,
            release=release,
            aliases=aliases,
        )
    finally:
        store.close()
    console.print(
        f"added model [bold]{svc.name}[/bold] (sha256:{svc.artifact_digest[:12]}, "
        f"{svc.artifact_size / 1e6:.1f} MB); placement group {pg.id} on "
        f"{ctx.identity.name} with {release.id}"
    )
