"""``letsinfer release``: signing keys, and signing and verifying release files."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import click

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.bundle.archive import BundleError
from letsinfer.cli import cli
from letsinfer.cli.output import brief, emit
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.engines.binary import BinaryError
from letsinfer.mirror.catalog import CatalogError
from letsinfer.mirror.errors import MirrorError
from letsinfer.release import keys
from letsinfer.release.signatures import (
    Signature,
    TrustError,
    require_signer,
    sha256_file,
    sign_digest,
    trusted_keys,
)

DEFAULT_KEY_NAME = "release-signing.key"


@contextmanager
def refusals() -> Iterator[None]:
    """Show a refused bundle, key, signature or mirror change as a plain error (exit 1)."""
    try:
        yield
    except (BundleError, TrustError, keys.ReleaseKeyError, CatalogError, MirrorError) as exc:
        raise click.ClickException(str(exc)) from exc


def default_key(ctx: CliContext) -> Path:
    return ctx.home.etc / DEFAULT_KEY_NAME


def node_trusted_keys(ctx: CliContext) -> list[keys.PublicKey]:
    return trusted_keys(config.load(ctx.home.config_file).release.trusted_keys)


# Who a verification trusts: `given_or_node_keys` reads it.
trusted_key_option = click.option(
    "--key",
    "key_texts",
    multiple=True,
    metavar="KEY",
    help="Trust this public key (ed25519:... or a .pub file) instead of the node's "
    "[release] trusted_keys; repeat for more.",
)


def given_or_node_keys(ctx: CliContext, key_texts: Sequence[str]) -> list[keys.PublicKey]:
    """Keys from --key (ed25519:... or a .pub file), or else the node's trusted keys."""
    if not key_texts:
        return node_trusted_keys(ctx)
    return [
        keys.load_public(Path(k)) if Path(k).is_file() else keys.PublicKey.parse(k)
        for k in key_texts
    ]


@cli.group()
def release() -> None:
    """Runtime releases and the keys that sign releases and bundles.

    `release list` and `release add` manage the runtime releases models run
    (main); `keygen`, `sign` and `verify` handle ed25519 signing keys and
    detached signatures of files (bundles are signed the same way)."""


@scoped(release, "keygen", scope="all")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help=f"Private key file (default: <etc>/{DEFAULT_KEY_NAME}); the public key goes to OUT.pub.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def keygen(ctx: CliContext, out: Path | None, as_json: bool) -> None:
    """Make an ed25519 signing key pair (the private key file is mode 0600)."""
    path = (out or default_key(ctx)).expanduser()
    with refusals():
        if out is None:
            ctx.home.etc.mkdir(parents=True, exist_ok=True, mode=0o700)
        public = keys.generate(path)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "private_key": str(path),
                    "public_key_file": str(keys.public_key_file(path)),
                    "public_key": public.text,
                    "fingerprint": public.fingerprint,
                }
            )
        )
        return
    click.echo(f"private key  {path}  (mode 0600: keep it on the signing machine only)")
    click.echo(f"public key   {keys.public_key_file(path)}")
    click.echo(f"fingerprint  {public.fingerprint}")
    click.echo("To trust it on a node, add to that node's config.toml:")
    click.echo(f'[release]\ntrusted_keys = ["{public.text}"]')
    # An Ansible site writes config.toml from this variable (the node role),
    # and the bundle role checks bundles against it on the workstation.
    click.echo("On an Ansible site, add to the inventory's group_vars/all.yml instead:")
    click.echo(f'node_release_trusted_keys:\n  - "{public.text}"')


def _signature_path(file: Path) -> Path:
    return file.with_name(file.name + ".sig")


@scoped(release, "sign", scope="all")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--key",
    "key_path",
    type=click.Path(path_type=Path),
    help=f"Private key (default: <etc>/{DEFAULT_KEY_NAME}).",
)
@click.option("--out", type=click.Path(path_type=Path), help="Signature file (default: FILE.sig).")
@click.pass_obj
def sign(ctx: CliContext, file: Path, key_path: Path | None, out: Path | None) -> None:
    """Write a detached signature of FILE."""
    with refusals():
        private = keys.load_private((key_path or default_key(ctx)).expanduser())
        if not file.is_file():
            raise click.ClickException(f"{file}: no such file")
        digest = sha256_file(file)
        signature = sign_digest(digest, private)
        target = out or _signature_path(file)
        tmp = target.with_name(f".{target.name}.part")
        tmp.write_bytes(signature.to_json())
        tmp.replace(target)
    click.echo(
        f"signed {file} (sha256 {brief(digest, 16)}) with key {signature.key.fingerprint}: {target}"
    )


@scoped(release, "verify", scope="all")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--signature",
    "signature_path",
    type=click.Path(path_type=Path),
    help="Signature file (default: FILE.sig).",
)
@trusted_key_option
@click.pass_obj
def verify(
    ctx: CliContext, file: Path, signature_path: Path | None, key_texts: tuple[str, ...]
) -> None:
    """Check FILE's signature against the trusted keys; exit 1 saying why if refused."""
    with refusals():
        trusted = given_or_node_keys(ctx, key_texts)
        if not file.is_file():
            raise click.ClickException(f"{file}: no such file")
        if signature_path is not None and not signature_path.is_file():
            raise click.ClickException(f"{signature_path}: no such file")
        sig_file = signature_path or _signature_path(file)
        signature = (
            Signature.from_json(sig_file.read_bytes(), str(sig_file))
            if sig_file.is_file()
            else None
        )
        signer = require_signer(sha256_file(file), signature, trusted, str(file))
    click.echo(f"{file}: good signature by trusted key {signer.fingerprint}")


# -- runtime releases: what placement groups run --------------------------------


@scoped(release, "list", scope="main", remote="viewer")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_releases(ctx: CliContext, as_json: bool) -> None:
    """Runtime releases in the authority (signed, kept for good): the ids that
    `model upgrade --release` and `model rollback --to` take, and what runs each."""
    if ctx.remote is not None:
        from letsinfer.cli.remote import call

        rows = call(ctx.remote, "GET", "/v1/ops/releases")
    else:
        from letsinfer.authority.views import release_rows

        store = open_authority(ctx.home)
        try:
            rows = release_rows(store)
        finally:
            store.close()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    emit(
        [
            {
                **r,
                "placement_groups": ", ".join(
                    f"{g['id']} ({g['model']})" for g in r["placement_groups"]
                ),
            }
            for r in rows
        ],
        ["id", "engine", "version", "target", "placement_groups"],
        as_json=False,
        title="runtime releases",
    )


@scoped(release, "add", scope="main", remote="administrator")
@click.option(
    "--llama-server",
    "binary",
    required=True,
    metavar="PATH",
    help="A llama-server binary; the release is bound to its path and bytes (sha256). "
    "From a controller: the absolute path of a binary already on the main under its "
    "model store, its mirror or [control] add_from.",
)
@click.option(
    "--target",
    type=click.Choice(["cpu", "cuda", "rocm", "metal"]),
    default="cpu",
    show_default=True,
    help="What the binary was built for: cpu, cuda, rocm or metal.",
)
@click.pass_obj
def add_release(ctx: CliContext, binary: str, target: str) -> None:
    """Make a signed runtime release of a llama-server binary as it is now, to
    upgrade models to (`letsinfer model upgrade NAME --release ID`). The binary
    must be at the same path on every node that runs the release. The main runs
    it once (`--version`): from a controller, only a binary the main already
    holds where controllers may add from, never any other path."""
    from letsinfer.release.adding import AddedRelease, add_runtime_release

    if ctx.remote is not None:
        from letsinfer.cli.remote import call

        answer = call(ctx.remote, "POST", "/v1/ops/releases", {"binary": binary, "target": target})
        added = AddedRelease(**{k: answer[k] for k in AddedRelease.__dataclass_fields__})
    else:
        store = open_authority(ctx.home)
        try:
            added = add_runtime_release(ctx.home, store, binary, target)
        except BinaryError as exc:
            raise click.ClickException(f"cannot release {binary}: {exc}. Nothing changed.") from exc
        finally:
            store.close()
    for line in added.lines():
        click.echo(line)
