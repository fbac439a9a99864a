"""``letsinfer wheelhouse``: sign a folder of wheels, and check one before installing it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from letsinfer.bundle.wheelpins import WheelhouseError, sign_folder, verify_wheelhouse
from letsinfer.cli import cli
from letsinfer.cli.release import (
    DEFAULT_KEY_NAME,
    default_key,
    given_or_node_keys,
    refusals,
    trusted_key_option,
)
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.release import keys


@cli.group()
def wheelhouse() -> None:
    """Signed wheelhouses: what a node that trusts release keys may install.

    `sign` lists every wheel of a folder with its sha256 in wheels.json and
    signs it; `verify` checks a folder or tar of wheels against that list and
    prints the pinned requirements `pip install --require-hashes` takes."""


@scoped(wheelhouse, "sign", scope="all")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option(
    "--key",
    "key_path",
    type=click.Path(path_type=Path),
    help=f"Private key (default: <etc>/{DEFAULT_KEY_NAME}).",
)
@click.pass_obj
def sign(ctx: CliContext, folder: Path, key_path: Path | None) -> None:
    """Write FOLDER/wheels.json (every wheel, its sha256) and its signature."""
    with refusals():
        private = keys.load_private((key_path or default_key(ctx)).expanduser())
        try:
            listing = sign_folder(folder, private)
        except WheelhouseError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(
        f"signed the list of {len(listing.wheels)} wheels in {folder} with key "
        f"{keys.public_key_of(private).fingerprint}"
    )


@scoped(wheelhouse, "verify", scope="all")
@click.argument("path", type=click.Path(path_type=Path))
@trusted_key_option
@click.option(
    "--listing-only",
    is_flag=True,
    help="PATH is wheels.json (or its folder) without the wheels: check its signature only.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def verify(
    ctx: CliContext, path: Path, key_texts: tuple[str, ...], listing_only: bool, as_json: bool
) -> None:
    """Check PATH (a folder or tar of wheels) against its signed list; print the
    pinned requirements, or exit 1 saying which wheel or signature was refused."""
    with refusals():
        trusted = given_or_node_keys(ctx, key_texts)
        try:
            seen = verify_wheelhouse(path, trusted, listing_only=listing_only)
        except WheelhouseError as exc:
            raise click.ClickException(str(exc)) from exc
    listing = seen.listing
    if as_json:
        doc = {
            "signer": seen.signer.fingerprint,
            "wheels": [w.model_dump() for w in listing.wheels],
            "letsinfer_version": listing.version_of("letsinfer"),
            "requirements": listing.requirements(),
        }
        click.echo(json.dumps(doc))
        return
    click.echo(f"{path}: signed by trusted key {seen.signer.fingerprint}", err=True)
    click.echo(listing.requirements(), nl=False)
