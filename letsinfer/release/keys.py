"""Release signing keys: an ed25519 pair, and the one-line public form nodes trust.

The public form is ``ed25519:<base64 of the 32 raw bytes>``: it is what
``[release] trusted_keys`` lists and what a signature names. The private key
is an unencrypted PKCS#8 PEM file that only its owner may read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PUBLIC_PREFIX = "ed25519:"


class ReleaseKeyError(Exception):
    """A key file or a public key is missing, malformed or unsafe; the message says which."""


@dataclass(frozen=True)
class PublicKey:
    raw: bytes  # the 32 raw ed25519 bytes

    @classmethod
    def parse(cls, text: str) -> PublicKey:
        text = text.strip()
        if not text.startswith(PUBLIC_PREFIX):
            raise ReleaseKeyError(
                f"{text!r} is not a release public key (expected ed25519:<base64>)"
            )
        try:
            raw = base64.b64decode(text[len(PUBLIC_PREFIX) :], validate=True)
        except binascii.Error:
            raw = b""
        if len(raw) != 32:
            raise ReleaseKeyError(f"{text!r} is not a release public key (not 32 bytes of base64)")
        return cls(raw)

    @property
    def text(self) -> str:
        return PUBLIC_PREFIX + base64.b64encode(self.raw).decode()

    @property
    def fingerprint(self) -> str:
        """A short, stable name for the key in messages and listings."""
        return hashlib.sha256(self.raw).hexdigest()[:16]

    def verifier(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.raw)


def public_key_of(private: Ed25519PrivateKey) -> PublicKey:
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return PublicKey(raw)


def public_key_file(private_path: Path) -> Path:
    return private_path.with_name(private_path.name + ".pub")


def generate(private_path: Path) -> PublicKey:
    """Write a new pair: the private key (0600, never overwritten) and ``PATH.pub``."""
    pub_path = public_key_file(private_path)
    for path in (private_path, pub_path):
        if path.exists():
            raise ReleaseKeyError(f"{path} already exists; refusing to overwrite a signing key")
    private_path.parent.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # O_EXCL: two keygens racing for one path must not both "win".
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public = public_key_of(private)
    try:
        pub_path.write_text(public.text + "\n")
    except BaseException:
        private_path.unlink()
        raise
    return public


def load_private(path: Path) -> Ed25519PrivateKey:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ReleaseKeyError(
            f"no signing key at {path}: create one with `letsinfer release keygen`, or pass --key"
        ) from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        # Like ssh: a private key others can read is no longer private.
        raise ReleaseKeyError(
            f"signing key {path} is accessible by other users (mode "
            f"{stat.S_IMODE(info.st_mode):04o}); run `chmod 600 {path}`"
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise ReleaseKeyError(f"{path} is not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ReleaseKeyError(f"{path} is not an ed25519 key")
    return key


def load_public(path: Path) -> PublicKey:
    try:
        return PublicKey.parse(path.read_text())
    except FileNotFoundError:
        raise ReleaseKeyError(f"no public key file at {path}") from None
