"""Importing a bundle: verify everything first, then place it in the mirror at once.

Order of checks, each refusing with its own message: the outer checksum, the
tar's structure and every member's type and path, the manifest's signature
against the node's trusted keys, the manifest against the members (missing,
extra, sizes), then every file's bytes while they are copied into a staging
folder inside the mirror. Only then does anything move into the mirror.

``verify_bundle`` makes the same checks in the same order and places nothing:
a workstation runs it before it hands a bundle to hosts (the Ansible role).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from letsinfer.bundle.archive import BundleError, copy_member, open_bundle, read_member
from letsinfer.bundle.manifest import Manifest, ManifestError
from letsinfer.bundle.paths import MANIFEST_NAME, SIGNATURE_NAME
from letsinfer.bundle.progress import Progress, Silent
from letsinfer.home import Home
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.mirror.placement import Placed, StagedBundle, discard, place_bundle
from letsinfer.release.keys import PublicKey
from letsinfer.release.signatures import (
    NoTrustedKeysError,
    Signature,
    TrustError,
    require_signer,
)

_MANIFEST_LIMIT = 64 << 20
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class SignedManifest:
    manifest: Manifest
    data: bytes
    sha256: str
    signature: bytes


def checksum_file(bundle: Path) -> Path:
    return bundle.with_name(bundle.name + ".sha256")


def read_checksum(bundle: Path) -> str:
    sums = checksum_file(bundle)
    try:
        words = sums.read_text().split()
    except FileNotFoundError:
        raise BundleError(
            f"no checksum for {bundle}: {sums} is missing (copy it along, or pass --sha256 HEX)"
        ) from None
    if not words or not _HEX64.fullmatch(words[0]):
        raise BundleError(f"{sums} does not hold a sha256 checksum")
    return words[0].lower()


def verify_checksum(bundle: Path, expected: str, progress: Progress) -> str:
    """Check the whole file's sha256; return it."""
    if not bundle.is_file():
        raise BundleError(f"{bundle}: no such file")
    h = hashlib.sha256()
    progress.start(f"checking {bundle.name}", bundle.stat().st_size)
    try:
        with bundle.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
                progress.advance(len(chunk))
    finally:
        progress.finish()
    if h.hexdigest() != expected.lower():
        raise BundleError(
            f"{bundle} does not match its checksum: its sha256 is {h.hexdigest()}, "
            f"expected {expected.lower()} (damaged or changed in transit)"
        )
    return h.hexdigest()


def read_manifest(
    tar: tarfile.TarFile, members: Mapping[str, tarfile.TarInfo], bundle: Path
) -> tuple[bytes, Signature | None, bytes]:
    if MANIFEST_NAME not in members:
        raise BundleError(f"{bundle} has no {MANIFEST_NAME}: it is not a letsinfer bundle")
    data = read_member(tar, members[MANIFEST_NAME], _MANIFEST_LIMIT)
    if SIGNATURE_NAME not in members:
        return data, None, b""
    sig_bytes = read_member(tar, members[SIGNATURE_NAME], 1 << 16)
    return data, Signature.from_json(sig_bytes, f"the bundle's {SIGNATURE_NAME}"), sig_bytes


def _parse(data: bytes) -> Manifest:
    try:
        return Manifest.from_bytes(data)
    except ManifestError as exc:
        raise BundleError(str(exc)) from exc


def check_members(manifest: Manifest, members: Mapping[str, tarfile.TarInfo]) -> None:
    listed = {f.path for f in manifest.files}
    present = set(members) - {MANIFEST_NAME, SIGNATURE_NAME}
    missing = sorted(listed - present)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise BundleError(
            f"file {missing[0]!r} is listed in the manifest but missing from the bundle{more}"
        )
    extra = sorted(present - listed)
    if extra:
        raise BundleError(f"bundle member {extra[0]!r} is not listed in the manifest")
    for f in manifest.files:
        size = members[f.path].size
        if size != f.size:
            raise BundleError(f"file {f.path!r} is {size} bytes, but the manifest says {f.size}")


def stage_files(
    tar: tarfile.TarFile,
    members: Mapping[str, tarfile.TarInfo],
    manifest: Manifest,
    workdir: Path,
    progress: Progress,
) -> dict[str, Path]:
    """Copy every file into ``workdir`` by digest, checking size and sha256."""
    blobs = workdir / "sha256"
    blobs.mkdir()
    staged: dict[str, Path] = {}
    progress.start("verifying files", manifest.total_size)
    try:
        # In archive order, so the tar is read front to back once.
        for f in sorted(manifest.files, key=lambda f: members[f.path].offset_data):
            dest = blobs / f.sha256 if f.sha256 not in staged else workdir / "duplicate"
            size, digest = copy_member(tar, members[f.path], dest, progress)
            if size != f.size:
                raise BundleError(f"file {f.path!r} is truncated: {size} of {f.size} bytes")
            if digest != f.sha256:
                raise BundleError(
                    f"file {f.path!r} does not match its sha256 in the manifest "
                    "(its bytes were changed)"
                )
            if f.sha256 in staged:
                dest.unlink()
            staged[f.sha256] = blobs / f.sha256
    finally:
        progress.finish()
    return staged


def hash_files(
    tar: tarfile.TarFile,
    members: Mapping[str, tarfile.TarInfo],
    manifest: Manifest,
    progress: Progress,
) -> None:
    """Read every file and check its size and sha256, writing nothing."""
    progress.start("verifying files", manifest.total_size)
    try:
        for f in sorted(manifest.files, key=lambda f: members[f.path].offset_data):
            fh = tar.extractfile(members[f.path])
            assert fh is not None  # regular files always have data
            h = hashlib.sha256()
            size = 0
            try:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
                    size += len(chunk)
                    progress.advance(len(chunk))
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise BundleError(f"bundle member {f.path!r} cannot be read ({exc})") from exc
            if size != f.size:
                raise BundleError(f"file {f.path!r} is truncated: {size} of {f.size} bytes")
            if h.hexdigest() != f.sha256:
                raise BundleError(
                    f"file {f.path!r} does not match its sha256 in the manifest "
                    "(its bytes were changed)"
                )
    finally:
        progress.finish()


@dataclass(frozen=True)
class Opened:
    """A bundle whose checksum, structure, signature and member list were checked."""

    tar: tarfile.TarFile
    members: Mapping[str, tarfile.TarInfo]
    manifest: Manifest
    manifest_bytes: bytes
    manifest_sha256: str
    signature_bytes: bytes
    signer: PublicKey
    sha256: str  # of the whole file


@contextlib.contextmanager
def open_verified(
    bundle: Path,
    trusted: Sequence[PublicKey],
    expected_sha256: str | None,
    progress: Progress,
) -> Iterator[Opened]:
    """Every check short of the files' bytes, in the documented order."""
    if not trusted:
        raise NoTrustedKeysError(
            "this node trusts no release key, so no bundle can be verified: add the signer's "
            "public key to [release] trusted_keys in config.toml (or "
            "LETSINFER_RELEASE__TRUSTED_KEYS)"
        )
    sha256 = verify_checksum(bundle, expected_sha256 or read_checksum(bundle), progress)
    with open_bundle(bundle) as (tar, members):
        data, signature, sig_bytes = read_manifest(tar, members, bundle)
        digest = hashlib.sha256(data).hexdigest()
        signer = require_signer(digest, signature, trusted, "the bundle's manifest")
        manifest = _parse(data)
        check_members(manifest, members)
        yield Opened(tar, members, manifest, data, digest, sig_bytes, signer, sha256)


@dataclass(frozen=True)
class Verified:
    manifest: Manifest
    manifest_sha256: str
    signer: str  # the trusted key's fingerprint
    sha256: str  # of the whole file

    @property
    def bundle_id(self) -> str:
        """The id an import gives it in the mirror."""
        return self.manifest_sha256[:16]


def verify_bundle(
    bundle: Path,
    trusted: Sequence[PublicKey],
    expected_sha256: str | None = None,
    progress: Progress | None = None,
) -> Verified:
    """Every check an import makes, every file's bytes included; nothing is written."""
    progress = progress or Silent()
    with open_verified(bundle, trusted, expected_sha256, progress) as opened:
        hash_files(opened.tar, opened.members, opened.manifest, progress)
    return Verified(
        opened.manifest, opened.manifest_sha256, opened.signer.fingerprint, opened.sha256
    )


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and each of its parents that does not exist yet, deepest first."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    return missing


def import_bundle(
    home: Home,
    bundle: Path,
    trusted: Sequence[PublicKey],
    expected_sha256: str | None = None,
    progress: Progress | None = None,
) -> tuple[Placed, Manifest]:
    """Verify ``bundle`` completely, then place it in the home's mirror."""
    progress = progress or Silent()
    layout = MirrorLayout.for_home(home)
    with open_verified(bundle, trusted, expected_sha256, progress) as opened:
        manifest = opened.manifest
        with layout.locked():
            made = _missing_folders(layout.root)  # what a refusal must take away again
            layout.root.mkdir(parents=True, exist_ok=True)
            workdir = Path(tempfile.mkdtemp(prefix=".import-", dir=layout.root))
            placed = None
            try:
                blobs = stage_files(opened.tar, opened.members, manifest, workdir, progress)
                staged = StagedBundle(
                    workdir=workdir,
                    blobs=blobs,
                    manifest=manifest,
                    manifest_bytes=opened.manifest_bytes,
                    manifest_sha256=opened.manifest_sha256,
                    signature_bytes=opened.signature_bytes,
                    signer=opened.signer.fingerprint,
                )
                placed = place_bundle(layout, staged)
            except OSError as exc:
                raise BundleError(
                    f"cannot place the bundle in {layout.root} ({exc}); nothing was imported"
                ) from exc
            finally:
                discard(workdir)
                if placed is None:
                    # A refused import leaves no trace, not even the folders
                    # (a fresh home's var/ included).
                    for folder in made:
                        with contextlib.suppress(OSError):
                            folder.rmdir()
    assert placed is not None
    return placed, manifest


@dataclass(frozen=True)
class Inspection:
    manifest: Manifest
    manifest_sha256: str
    signer: str | None  # fingerprint of the key named by the signature, if any
    trust: str  # "trusted" or the reason this node would refuse it


def inspect_bundle(bundle: Path, trusted: Sequence[PublicKey]) -> Inspection:
    """Read the manifest and judge its signature, without checking file contents."""
    with open_bundle(bundle) as (tar, members):
        data, signature, _ = read_manifest(tar, members, bundle)
    digest = hashlib.sha256(data).hexdigest()
    try:
        signer = require_signer(digest, signature, trusted, "the manifest")
        trust = f"trusted: signed by key {signer.fingerprint}"
    except TrustError as exc:
        trust = str(exc)
    return Inspection(
        manifest=_parse(data),
        manifest_sha256=digest,
        signer=signature.key.fingerprint if signature else None,
        trust=trust,
    )
