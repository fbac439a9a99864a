"""``letsinfer mirror``: the artifacts imported bundles brought to this node."""

from __future__ import annotations

import click

from letsinfer import config
from letsinfer.cli import cli
from letsinfer.cli.bundle import TerminalProgress, audit_on_main
from letsinfer.cli.output import brief, emit, errors
from letsinfer.cli.release import refusals
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.fetch import FetchPolicy
from letsinfer.mirror.adding import add_artifact
from letsinfer.mirror.catalog import ArtifactRecord, read_catalog
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.mirror.references import authority_references, unused
from letsinfer.mirror.removal import remove_artifact


@cli.group()
def mirror() -> None:
    """Imported artifacts, kept by sha256: add, list, find unused, remove."""


def _show_artifacts(artifacts: list[ArtifactRecord], as_json: bool, title: str) -> None:
    if as_json:
        emit([a.model_dump() for a in artifacts], [], as_json=True)
        return
    emit(
        [
            {
                "sha256": brief(a.digest, 16),
                "kind": a.kind,
                "size": f"{a.size / 1e6:.1f} MB",
                "names": ", ".join(a.names),
            }
            for a in artifacts
        ],
        ["sha256", "kind", "size", "names"],
        as_json=False,
        title=title,
    )


@scoped(mirror, "list", scope="all")
@click.option("--bundles", "show_bundles", is_flag=True, help="List imported bundles instead.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_mirror(ctx: CliContext, show_bundles: bool, as_json: bool) -> None:
    """List the mirror's artifacts (or, with --bundles, the bundles imported)."""
    with refusals():
        catalog = read_catalog(MirrorLayout.for_home(ctx.home))
    if not show_bundles:
        _show_artifacts([a for _, a in sorted(catalog.artifacts.items())], as_json, "artifacts")
        return
    bundles = sorted(catalog.bundles.values(), key=lambda b: b.imported_at)
    if as_json:
        emit(
            [{**b.model_dump(), "removed_files": catalog.missing_files(b)} for b in bundles],
            [],
            as_json=True,
        )
        return
    rows = []
    for b in bundles:
        removed = catalog.missing_files(b)
        rows.append(
            {
                "id": b.id,
                "created_at": b.created_at,
                "imported_at": b.imported_at,
                "signer": b.signer,
                "files": f"{len(b.files)}" + (f" ({len(removed)} removed)" if removed else ""),
                "models": ", ".join(m.name for m in b.models),
            }
        )
    emit(
        rows,
        ["id", "created_at", "imported_at", "signer", "files", "models"],
        as_json=False,
        title="imported bundles",
    )


@scoped(mirror, "unused", scope="main", remote="viewer")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_unused(ctx: CliContext, as_json: bool) -> None:
    """Artifacts no model service or runtime release refers to (safe to remove)."""
    if ctx.remote is not None:
        from letsinfer.cli.remote import call

        rows = call(ctx.remote, "GET", "/v1/ops/mirror/unused")
        found = [ArtifactRecord.model_validate(r) for r in rows]
    else:
        with refusals():
            # Both sources must be readable: a guess here would lead to a wrong removal.
            catalog = read_catalog(MirrorLayout.for_home(ctx.home))
            references = authority_references(ctx.home.database)
        found = unused(catalog, references)
    _show_artifacts(found, as_json, "unused artifacts")
    if not as_json and found:
        click.echo(f"{len(found)} unused, {sum(a.size for a in found) / 1e6:.1f} MB")


@scoped(mirror, "remove", scope="main", remote="administrator")
@click.argument("digest")
@click.pass_obj
def remove(ctx: CliContext, digest: str) -> None:
    """Remove one artifact (sha256 or a unique prefix); refused while anything refers to it."""
    if ctx.remote is not None:
        from letsinfer.cli.remote import call

        removed = ArtifactRecord.model_validate(
            call(ctx.remote, "POST", "/v1/ops/mirror/remove", {"digest": digest})
        )
    else:
        with refusals():
            references = authority_references(ctx.home.database)
            removed = remove_artifact(MirrorLayout.for_home(ctx.home), digest, references)
        audit_on_main(ctx, "mirror.remove", f"sha256:{removed.digest}", ", ".join(removed.names))
    click.echo(f"removed sha256:{brief(removed.digest, 16)} ({', '.join(removed.names)})")


@scoped(mirror, "add", scope="all")
@click.argument("source", metavar="URL|FILE")
@click.option("--sha256", "sha256", required=True, metavar="HEX", help="The artifact's sha256.")
@click.option(
    "--kind",
    type=click.Choice(["model", "runtime", "wheel"]),
    default="model",
    show_default=True,
    help="What the artifact is.",
)
@click.pass_obj
def add(ctx: CliContext, source: str, sha256: str, kind: str) -> None:
    """Put one artifact in this node's mirror: fetched (or copied) to a temporary
    name, its length and sha256 checked, then renamed into place."""
    with refusals():
        record, new = add_artifact(
            MirrorLayout.for_home(ctx.home),
            source,
            sha256,
            kind,
            TerminalProgress(errors),  # type: ignore[arg-type]
            FetchPolicy.from_settings(config.load(ctx.home.config_file)),
        )
    if not new:
        click.echo(f"sha256:{brief(record.digest, 16)} is already in the mirror; nothing changed")
        return
    audit_on_main(ctx, "mirror.add", f"sha256:{record.digest}", source)
    size = f"{record.size / 1e6:.1f} MB"
    click.echo(f"added sha256:{brief(record.digest, 16)} ({record.kind}, {size})")
