"""``letsinfer bundle``: offline bundles for air-gapped sites."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from letsinfer.audit.anchor import open_authority
from letsinfer.bundle.creation import CreateRequest, create_bundle
from letsinfer.bundle.importing import import_bundle, inspect_bundle, verify_bundle
from letsinfer.bundle.manifest import Manifest
from letsinfer.bundle.runtimes import Installed, install_runtimes
from letsinfer.cli import cli
from letsinfer.cli.output import brief, emit, errors
from letsinfer.cli.release import (
    DEFAULT_KEY_NAME,
    default_key,
    given_or_node_keys,
    node_trusted_keys,
    refusals,
    trusted_key_option,
)
from letsinfer.cli.scope import CliContext, scoped


class TerminalProgress:
    """Bundle steps as rich progress bars on stderr (so --json output stays clean)."""

    def __init__(self, out: Console) -> None:
        self._out = out
        self._bar: Progress | None = None
        self._task: Any = None

    def start(self, description: str, total: int | None) -> None:
        self.finish()
        if not self._out.is_terminal:
            self._out.print(f"{description} …")
            return
        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=self._out,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(description, total=total)

    def advance(self, amount: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, amount)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def audit_on_main(ctx: CliContext, action: str, target: str, detail: str) -> None:
    """On a main node, changes to the mirror join the audit chain."""
    if ctx.identity is None or ctx.identity.role != "main" or not ctx.home.database.is_file():
        return
    store = open_authority(ctx.home)
    try:
        store.append_audit("cli", action, "ok", target=target, detail=detail)
    finally:
        store.close()


def _install_runtimes(ctx: CliContext, manifest: Manifest, bundle_id: str) -> Installed:
    """Install the bundle's runtimes here; on the main, register their releases."""
    on_main = ctx.identity is not None and ctx.identity.role == "main"
    store = open_authority(ctx.home) if on_main and ctx.home.database.is_file() else None
    try:
        return install_runtimes(ctx.home, manifest, store, bundle_id)
    finally:
        if store is not None:
            store.close()


@cli.group()
def bundle() -> None:
    """Offline bundles: create on a connected machine, import on an air-gapped one."""


@scoped(bundle, "create", scope="all")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="The bundle file.")
@click.option(
    "--key",
    "key_path",
    type=click.Path(path_type=Path),
    help=f"Signing key (default: <etc>/{DEFAULT_KEY_NAME}, from `letsinfer release keygen`).",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="MODEL",
    help="NAME (a model service of this node), PATH or NAME=PATH (a GGUF file), or "
    "REPO@REV[:FILE|:QUANT] (a hub repository at a revision: every GGUF model in it, or "
    "the one FILE or QUANT names; repo and commit are recorded for `model pull`); "
    "repeat for more.",
)
@click.option(
    "--runtime",
    "runtimes",
    multiple=True,
    metavar="ID",
    help="xllamacpp (or llama.cpp-xllamacpp-VERSION-cpu), or llama-server[:TARGET]=PATH.",
)
@click.option(
    "--platform",
    "platforms",
    multiple=True,
    metavar="TAG",
    help="Target pip platform tag, e.g. manylinux2014_x86_64 (default: this machine's).",
)
@click.option("--python-version", metavar="3.N", help="Target Python (default: this one's).")
@click.option(
    "--wheels/--no-wheels",
    default=True,
    help="Include letsinfer and its dependencies as wheels (default: yes).",
)
@click.option(
    "--source",
    type=click.Path(path_type=Path, file_okay=False),
    help="letsinfer's source tree (default: the one this letsinfer runs from).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def create(
    ctx: CliContext,
    out: Path,
    key_path: Path | None,
    models: tuple[str, ...],
    runtimes: tuple[str, ...],
    platforms: tuple[str, ...],
    python_version: str | None,
    wheels: bool,
    source: Path | None,
    as_json: bool,
) -> None:
    """Create a signed bundle: wheelhouse, runtimes and models, with a checksum beside it."""
    request = CreateRequest(
        out=out,
        key=key_path or default_key(ctx),
        models=models,
        runtimes=runtimes,
        platforms=platforms,
        python_version=python_version,
        wheels=wheels,
        source=source,
    )
    with refusals():
        created = create_bundle(ctx.home, request, TerminalProgress(errors))
    m = created.manifest
    if as_json:
        doc = {
            "path": str(created.path),
            "sha256": created.sha256,
            "checksum_file": str(created.checksum_file),
            "signer": created.signer,
            "files": len(m.files),
            "size": m.total_size,
        }
        click.echo(json.dumps(doc))
        return
    click.echo(
        f"wrote {created.path}: {len(m.files)} files, {_mb(m.total_size)}, "
        f"signed by key {created.signer}"
    )
    click.echo(f"sha256 {created.sha256}  (also in {created.checksum_file.name})")


@scoped(bundle, "import", scope="all")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--sha256", "expected", metavar="HEX", help="Expected sha256 (default: FILE.sha256).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def import_(ctx: CliContext, file: Path, expected: str | None, as_json: bool) -> None:
    """Verify FILE completely, then place its artifacts in this node's mirror."""
    # A refused bundle changes nothing on the node, the audit chain included.
    with refusals():
        placed, manifest = import_bundle(
            ctx.home, file, node_trusted_keys(ctx), expected, TerminalProgress(errors)
        )
    tree = placed.path
    if not placed.already_imported:
        audit_on_main(
            ctx, "bundle.import", placed.bundle.id, f"sha256:{placed.bundle.manifest_sha256}"
        )
    with refusals():
        runtimes_made = _install_runtimes(ctx, manifest, placed.bundle.id)
    digest_of = {f.path: f.sha256 for f in manifest.files}
    wheelhouse = tree / "wheelhouse" if any(f.kind == "wheel" for f in manifest.files) else None
    models = [
        {"name": mod.name, "path": str(tree / mod.path), "sha256": digest_of[mod.path]}
        for mod in manifest.models
    ]
    runtimes = [r.id for r in manifest.runtimes]
    made_ids = [r.id for r in runtimes_made.releases]
    if as_json:
        doc = {
            "bundle": placed.bundle.id,
            "manifest_sha256": placed.bundle.manifest_sha256,
            "signer": placed.bundle.signer,
            "already_imported": placed.already_imported,
            "new_artifacts": placed.new_artifacts,
            "new_bytes": placed.new_bytes,
            "path": str(tree),
            "wheelhouse": str(wheelhouse) if wheelhouse else None,
            "models": models,
            "runtimes": runtimes,
            "releases": made_ids,  # each runtime's release (registered on the main)
            "registered": runtimes_made.registered,
        }
        click.echo(json.dumps(doc))
        return
    if placed.already_imported:
        click.echo(f"bundle {placed.bundle.id} is already imported; nothing changed")
    else:
        click.echo(
            f"imported bundle {placed.bundle.id} (signed by key {placed.bundle.signer}): "
            f"{len(manifest.files)} files, {placed.new_artifacts} new ({_mb(placed.new_bytes)})"
        )
    click.echo(f"  bundle      {tree}")
    if wheelhouse:
        click.echo(f"  wheelhouse  {wheelhouse}")
        # Only the signed wheels, by their sha256 (wheels.json in the wheelhouse).
        click.echo(f"  install     letsinfer wheelhouse verify {wheelhouse} > requirements.txt")
        click.echo(
            f"              pip install --require-hashes --no-index --find-links {wheelhouse} "
            "-r requirements.txt"
        )
    for mod, spec in zip(models, manifest.models, strict=True):
        if spec.source is not None:
            s = spec.source
            click.echo(
                f"  model       letsinfer model pull {s.repo} --file {s.files[0].name} "
                f"--revision {s.revision}"
            )
        else:
            click.echo(f"  model       letsinfer model add {mod['name']} --gguf {mod['path']}")
    for release in runtimes_made.releases:
        new = " (registered)" if release.id in runtimes_made.registered else ""
        click.echo(f"  runtime     release {release.id}{new}")


@scoped(bundle, "verify", scope="all")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--sha256", "expected", metavar="HEX", help="Expected sha256 (default: FILE.sha256).")
@trusted_key_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def verify(
    ctx: CliContext, file: Path, expected: str | None, key_texts: tuple[str, ...], as_json: bool
) -> None:
    """Make every check an import makes (checksum, signature, every file) and change nothing."""
    with refusals():
        trusted = given_or_node_keys(ctx, key_texts)
        seen = verify_bundle(file, trusted, expected, TerminalProgress(errors))
    m = seen.manifest
    digest_of = {f.path: f.sha256 for f in m.files}
    if as_json:
        doc = {
            "bundle": seen.bundle_id,
            "sha256": seen.sha256,
            "manifest_sha256": seen.manifest_sha256,
            "signer": seen.signer,
            "letsinfer_version": m.wheel_version("letsinfer"),
            "wheelhouse": any(f.kind == "wheel" for f in m.files),
            "models": [
                {
                    "name": mod.name,
                    "path": mod.path,
                    "sha256": digest_of[mod.path],
                    # A hub model: what `model pull` takes it as (the bundle
                    # role serves it so, with its provenance).
                    "source": mod.source
                    and {
                        "repo": mod.source.repo,
                        "revision": mod.source.revision,
                        "commit": mod.source.commit,
                        "file": mod.source.files[0].name,
                    },
                }
                for mod in m.models
            ],
            "runtimes": [r.id for r in m.runtimes],
            "files": len(m.files),
            "size": m.total_size,
        }
        click.echo(json.dumps(doc))
        return
    click.echo(
        f"{file}: bundle {seen.bundle_id} is intact and signed by trusted key {seen.signer} "
        f"({len(m.files)} files, {_mb(m.total_size)}, every checksum matches)"
    )
    version = m.wheel_version("letsinfer")
    if version:
        click.echo(f"  letsinfer  {version}")
    for mod in m.models:
        click.echo(f"  model      {mod.name} ({mod.path})")
    for rid in m.runtimes:
        click.echo(f"  runtime    {rid}")


@scoped(bundle, "inspect", scope="all")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def inspect(ctx: CliContext, file: Path, as_json: bool) -> None:
    """Show FILE's manifest and whether this node would trust its signature."""
    with refusals():
        seen = inspect_bundle(file, node_trusted_keys(ctx))
    m = seen.manifest
    if as_json:
        doc = {
            **m.as_json(),
            "manifest_sha256": seen.manifest_sha256,
            "signer": seen.signer,
            "trust": seen.trust,
        }
        click.echo(json.dumps(doc, indent=2))
        return
    target = ", ".join(m.target.platforms) or f"{m.target.built_on} (where it was made)"
    click.echo(f"bundle {brief(seen.manifest_sha256, 16)}  made {m.created_at} by {m.created_by}")
    click.echo(f"  target     {target}, Python {m.target.python_version}")
    click.echo(f"  signature  {seen.trust}")
    for mod in m.models:
        click.echo(f"  model      {mod.name} ({mod.path})")
    for r in m.runtimes:
        click.echo(f"  runtime    {r.id}")
    emit(
        [
            {"path": f.path, "kind": f.kind, "size": _mb(f.size), "sha256": brief(f.sha256, 16)}
            for f in m.files
        ],
        ["path", "kind", "size", "sha256"],
        as_json=False,
        title=f"{len(m.files)} files, {_mb(m.total_size)}",
    )
