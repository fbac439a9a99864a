"""Detached signatures and the node's trust policy.

A signature covers ``sha256(content)`` under a fixed context string, so a
large file is signed and checked by streaming, and a letsinfer signature can
never be replayed as a signature of anything else. The signature document is
small JSON: the signer's public key, the content digest, the signature.

Policy (issue 7): a node trusts the keys in its config; anything signed by
another key, or unsigned while a key is trusted, is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from letsinfer.release.keys import PublicKey, ReleaseKeyError, public_key_of

_CONTEXT = b"letsinfer release signature v1\x00"
FORMAT = "letsinfer-signature/1"


class TrustError(Exception):
    """Signed content was refused; the message says exactly why."""


class UnsignedError(TrustError):
    pass


class UntrustedKeyError(TrustError):
    pass


class BadSignatureError(TrustError):
    pass


class NoTrustedKeysError(TrustError):
    pass


class MalformedSignatureError(TrustError):
    pass


@dataclass(frozen=True)
class Signature:
    key: PublicKey
    sha256: str  # hex digest of the signed content
    value: bytes  # 64 bytes of ed25519 signature

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "key": self.key.text,
            "sha256": self.sha256,
            "signature": base64.b64encode(self.value).decode(),
        }
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, source: str) -> Signature:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError(f"format is not {FORMAT}")
            value = base64.b64decode(doc["signature"], validate=True)
            digest = doc["sha256"]
            if not (isinstance(digest, str) and len(digest) == 64):
                raise ValueError("sha256 is not a hex digest")
            return cls(key=PublicKey.parse(doc["key"]), sha256=digest, value=value)
        except (ValueError, KeyError, TypeError, binascii.Error, ReleaseKeyError) as exc:
            raise MalformedSignatureError(f"{source} is not a letsinfer signature ({exc})") from exc


def _message(sha256_hex: str) -> bytes:
    return _CONTEXT + bytes.fromhex(sha256_hex)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def sign_digest(sha256_hex: str, private: Ed25519PrivateKey) -> Signature:
    return Signature(
        key=public_key_of(private), sha256=sha256_hex, value=private.sign(_message(sha256_hex))
    )


def sign_bytes(data: bytes, private: Ed25519PrivateKey) -> Signature:
    return sign_digest(hashlib.sha256(data).hexdigest(), private)


def _names(keys: Sequence[PublicKey]) -> str:
    return ", ".join(k.fingerprint for k in keys)


def check(
    sha256_hex: str,
    signature: Signature | None,
    trusted: Sequence[PublicKey],
    what: str,
) -> PublicKey | None:
    """Apply the trust policy to content whose digest is ``sha256_hex``.

    Returns the trusted signer, or None for unsigned content on a node that
    trusts no key (callers that need a signer refuse that themselves).
    """
    if signature is None:
        if trusted:
            raise UnsignedError(
                f"{what} is unsigned, and this node trusts release keys ({_names(trusted)}): "
                "refusing unsigned content"
            )
        return None
    signer = signature.key
    if signer not in trusted:
        if not trusted:
            raise NoTrustedKeysError(
                f"{what} is signed by key {signer.fingerprint}, but this node trusts no release "
                "key: add the signer's public key to [release] trusted_keys in config.toml "
                "(or LETSINFER_RELEASE__TRUSTED_KEYS)"
            )
        raise UntrustedKeyError(
            f"{what} is signed by key {signer.fingerprint}, which this node does not trust "
            f"(trusted: {_names(trusted)})"
        )
    try:
        signer.verifier().verify(signature.value, _message(signature.sha256))
    except InvalidSignature:
        raise BadSignatureError(
            f"{what}: the signature by key {signer.fingerprint} is not valid "
            "(the signature itself was altered or forged)"
        ) from None
    if signature.sha256 != sha256_hex:
        raise BadSignatureError(
            f"{what} does not match its signature by key {signer.fingerprint}: "
            "it was changed after signing"
        )
    return signer


def require_signer(
    sha256_hex: str,
    signature: Signature | None,
    trusted: Sequence[PublicKey],
    what: str,
) -> PublicKey:
    """Like :func:`check`, but content must carry a trusted signature."""
    signer = check(sha256_hex, signature, trusted, what)
    if signer is None:
        raise NoTrustedKeysError(
            f"{what} is unsigned and this node trusts no release key: nothing vouches for it. "
            "Add the signer's public key to [release] trusted_keys in config.toml "
            "(or LETSINFER_RELEASE__TRUSTED_KEYS)"
        )
    return signer


def trusted_keys(texts: Sequence[str]) -> list[PublicKey]:
    return [PublicKey.parse(t) for t in texts]
