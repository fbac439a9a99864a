"""The signed list of a wheelhouse: every wheel it may install, by name, version and sha256.

``wheels.json`` sits beside the wheels with its detached signature
``wheels.json.sig`` (the release key, as for bundles). Where a node trusts a
release key, letsinfer is installed only from what a trusted list names: the
list becomes a pip requirements file of ``name==version --hash=sha256:...``
lines for ``pip install --require-hashes``, so pip itself refuses a wheel whose
bytes are not the signed ones and any package the list does not pin.

``verify_wheelhouse`` checks a folder or a tar of wheels before anything is
installed: the signature, then no wheel missing and none extra, then every
wheel's bytes. Each refusal says which file and why.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from letsinfer.release.keys import PublicKey
from letsinfer.release.signatures import Signature, require_signer, sign_bytes

LISTING_NAME: Final = "wheels.json"
LISTING_SIGNATURE: Final = "wheels.json.sig"
FORMAT: Final = "letsinfer-wheels/1"
_LISTING_LIMIT = 4 << 20
# A wheel file name: name-version(-build)?-python-abi-platform.whl (PEP 427).
_WHEEL_FILE = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)(-[0-9][A-Za-z0-9_.]*)?"
    r"-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl$"
)


class WheelhouseError(Exception):
    """The wheelhouse or its list was refused; the message says why. Nothing was installed."""


class PinnedWheel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(max_length=255, pattern=_WHEEL_FILE.pattern)
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    version: str = Field(pattern=r"^[A-Za-z0-9_.!+-]{1,64}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class WheelListing(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["letsinfer-wheels/1"] = FORMAT
    wheels: tuple[PinnedWheel, ...] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _one_of_each(self) -> WheelListing:
        files = [w.file for w in self.wheels]
        if len(set(files)) != len(files):
            raise ValueError("a wheel is listed twice")
        return self

    def to_bytes(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> WheelListing:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "list"
            raise WheelhouseError(
                f"{LISTING_NAME} is not a wheelhouse list ({where}: {first['msg']})"
            ) from exc

    def version_of(self, project: str) -> str | None:
        wanted = _canonical(project)
        return next((w.version for w in self.wheels if _canonical(w.name) == wanted), None)

    def requirements(self) -> str:
        """A pip requirements file for ``--require-hashes``: every wheel, pinned."""
        return "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in self.wheels)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def listing_of(wheels: Iterable[Path]) -> WheelListing:
    """The list of these wheel files (name and version from each file's name)."""
    pinned = []
    for wheel in sorted(wheels, key=lambda p: p.name):
        m = _WHEEL_FILE.match(wheel.name)
        if m is None:
            raise WheelhouseError(f"{wheel.name} is not a wheel's file name")
        pinned.append(
            PinnedWheel(
                file=wheel.name, name=m["name"], version=m["version"], sha256=_sha256(wheel)
            )
        )
    return WheelListing(wheels=tuple(pinned))


def signed_listing(wheels: Iterable[Path], private: Ed25519PrivateKey) -> tuple[bytes, bytes]:
    """``wheels.json`` and ``wheels.json.sig`` for these wheels."""
    data = listing_of(wheels).to_bytes()
    return data, sign_bytes(data, private).to_json()


def sign_folder(folder: Path, private: Ed25519PrivateKey) -> WheelListing:
    """Write the signed list of every wheel in ``folder`` into it."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise WheelhouseError(f"{folder} holds no wheels (*.whl) to list")
    data, signature = signed_listing(wheels, private)
    for name, content in ((LISTING_NAME, data), (LISTING_SIGNATURE, signature)):
        part = folder / f".{name}.part"
        part.write_bytes(content)
        part.replace(folder / name)
    return WheelListing.from_bytes(data)


def verify_listing(
    data: bytes, signature: bytes | None, trusted: Sequence[PublicKey], where: str
) -> tuple[WheelListing, PublicKey]:
    """The list, once a trusted key's signature over exactly these bytes is checked."""
    sig = Signature.from_json(signature, f"{where}'s {LISTING_SIGNATURE}") if signature else None
    signer = require_signer(
        hashlib.sha256(data).hexdigest(), sig, trusted, f"the wheel list of {where}"
    )
    return WheelListing.from_bytes(data), signer


@dataclass(frozen=True)
class VerifiedWheels:
    listing: WheelListing
    signer: PublicKey


def _compare_files(listing: WheelListing, present: Iterable[str], where: str) -> None:
    listed = {w.file for w in listing.wheels}
    present = set(present)
    missing = sorted(listed - present)
    if missing:
        raise WheelhouseError(f"wheel {missing[0]} is in the signed list but not in {where}")
    extra = sorted(present - listed)
    if extra:
        raise WheelhouseError(
            f"wheel {extra[0]} in {where} is not in the signed list "
            "(added after signing): refusing the wheelhouse"
        )


def _check_digest(wheel: str, digest: str, expected: Mapping[str, str], where: str) -> None:
    if digest != expected[wheel]:
        raise WheelhouseError(
            f"wheel {wheel} in {where} does not match the signed list: its sha256 is "
            f"{digest}, signed {expected[wheel]} (its bytes were changed after signing)"
        )


def _read_listing(
    listing: Path, trusted: Sequence[PublicKey], where: str
) -> tuple[WheelListing, PublicKey]:
    try:
        data = listing.read_bytes()
    except FileNotFoundError:
        raise WheelhouseError(
            f"{where} has no signed wheel list ({LISTING_NAME}); a node that trusts release "
            "keys installs only listed wheels (`letsinfer wheelhouse sign DIR`)"
        ) from None
    sig_file = listing.with_name(listing.name + ".sig")
    signature = sig_file.read_bytes() if sig_file.is_file() else None
    return verify_listing(data, signature, trusted, where)


def _verify_folder(folder: Path, trusted: Sequence[PublicKey]) -> VerifiedWheels:
    where = str(folder)
    listing, signer = _read_listing(folder / LISTING_NAME, trusted, where)
    _compare_files(listing, (p.name for p in folder.glob("*.whl")), where)
    expected = {w.file: w.sha256 for w in listing.wheels}
    for wheel in sorted(expected):
        _check_digest(wheel, _sha256(folder / wheel), expected, where)
    return VerifiedWheels(listing, signer)


def _verify_tar(archive: Path, trusted: Sequence[PublicKey]) -> VerifiedWheels:
    where = str(archive)
    try:
        with tarfile.open(archive, "r:*") as tar:
            return _check_tar(tar, trusted, where)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise WheelhouseError(f"{where} is not a readable tar of wheels ({exc})") from exc


def _check_tar(tar: tarfile.TarFile, trusted: Sequence[PublicKey], where: str) -> VerifiedWheels:
    files: dict[str, tarfile.TarInfo] = {}
    for info in tar.getmembers():
        name = info.name.removeprefix("./")
        if info.isdir() and name in ("", "."):
            continue
        if not info.isfile() or "/" in name:
            raise WheelhouseError(
                f"{where}: member {info.name!r} is not a plain file at the top of the tar"
            )
        if name in files:
            raise WheelhouseError(f"{where}: member {name!r} appears twice")
        files[name] = info

    def read(name: str, limit: int) -> bytes | None:
        info = files.get(name)
        if info is None:
            return None
        if info.size > limit:
            raise WheelhouseError(f"{where}: {name} is too large ({info.size} bytes)")
        fh = tar.extractfile(info)
        assert fh is not None  # a regular file
        return fh.read()

    data = read(LISTING_NAME, _LISTING_LIMIT)
    if data is None:
        raise WheelhouseError(
            f"{where} has no signed wheel list ({LISTING_NAME}); a node that trusts release "
            "keys installs only listed wheels (`letsinfer wheelhouse sign DIR`)"
        )
    listing, signer = verify_listing(data, read(LISTING_SIGNATURE, 1 << 16), trusted, where)
    others = set(files) - {LISTING_NAME, LISTING_SIGNATURE}
    _compare_files(listing, others, where)
    expected = {w.file: w.sha256 for w in listing.wheels}
    for name in sorted(expected):
        fh = tar.extractfile(files[name])
        assert fh is not None
        h = hashlib.sha256()
        while chunk := fh.read(1 << 20):
            h.update(chunk)
        _check_digest(name, h.hexdigest(), expected, where)
    return VerifiedWheels(listing, signer)


def verify_wheelhouse(
    path: Path, trusted: Sequence[PublicKey], *, listing_only: bool = False
) -> VerifiedWheels:
    """Check a wheelhouse (a folder, or a tar of wheels) against its signed list.

    ``listing_only``: ``path`` is the list itself (or the folder holding it),
    its signature beside it; only the signature is checked, for wheels that
    are elsewhere (an index, another host), whose bytes pip checks.
    """
    if listing_only:
        listing = path / LISTING_NAME if path.is_dir() else path
        return VerifiedWheels(*_read_listing(listing, [*trusted], str(path)))
    if path.is_dir():
        return _verify_folder(path, trusted)
    if path.is_file():
        return _verify_tar(path, trusted)
    raise WheelhouseError(f"{path}: no such folder or file")
