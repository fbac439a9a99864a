"""Join codes: what `letsinfer node add --code` prints and `letsinfer join` reads.

A code is ``LI1-<id>-<ca>-<secret>`` in base32 (letters and digits 2-7,
case-insensitive): ``id`` names the code on the main (not secret), ``ca`` is
the first 128 bits of the SHA-256 of the cluster CA certificate (the main is
trusted only if it presents a certificate of a CA with that fingerprint), and
``secret`` is 120 random bits. The secret never travels: it seeds an Ed25519
key, the main keeps only that key's public half, and the candidate proves the
secret by signing the main's fresh nonce, its CSR and the CA it checked. So
neither a listener, nor a main it reached by mistake, nor a copy of the
main's database learns anything that admits another machine.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PREFIX = "LI1"
ID_BYTES = 5  # 8 characters
CA_BYTES = 16  # 26 characters: a CA matching them costs 2**128 hashes
SECRET_BYTES = 15  # 24 characters
_PROOF_CONTEXT = b"letsinfer join proof v1\x00"
_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")


class JoinCodeError(ValueError):
    """A code that cannot be one: the message says what is wrong with it."""


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw).decode().rstrip("=")


def _unb32(text: str, size: int, what: str) -> bytes:
    want = len(_b32(bytes(size)))
    if len(text) != want:
        raise JoinCodeError(f"its {what} part has {len(text)} characters, not {want}")
    bad = sorted(set(text) - _ALPHABET)
    if bad:
        raise JoinCodeError(
            f"its {what} part holds {''.join(bad)!r}: a code has only letters and digits 2-7"
        )
    try:
        return base64.b32decode(text + "=" * (-len(text) % 8))[:size]
    except binascii.Error as exc:
        raise JoinCodeError(f"its {what} part is not base32: {exc}") from exc


@dataclass(frozen=True)
class JoinCode:
    code_id: str
    ca_prefix: bytes
    secret: bytes

    @classmethod
    def new(cls, ca_fingerprint: str) -> JoinCode:
        return cls(
            code_id=_b32(secrets.token_bytes(ID_BYTES)),
            ca_prefix=bytes.fromhex(ca_fingerprint)[:CA_BYTES],
            secret=secrets.token_bytes(SECRET_BYTES),
        )

    @classmethod
    def parse(cls, text: str) -> JoinCode:
        """Raise JoinCodeError (saying what is wrong) unless ``text`` is a code."""
        parts = text.strip().upper().split("-")
        if parts[0] != PREFIX:
            raise JoinCodeError(
                f"a join code starts with {PREFIX}- (as `letsinfer node add --code` prints it)"
            )
        if len(parts) != 4:
            raise JoinCodeError(
                f"a join code has 4 parts separated by '-', this one has {len(parts)}"
            )
        _unb32(parts[1], ID_BYTES, "id")
        return cls(
            code_id=parts[1],
            ca_prefix=_unb32(parts[2], CA_BYTES, "fingerprint"),
            secret=_unb32(parts[3], SECRET_BYTES, "secret"),
        )

    def __str__(self) -> str:
        return "-".join((PREFIX, self.code_id, _b32(self.ca_prefix), _b32(self.secret)))

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"JoinCode({self.code_id})"

    def names_ca(self, ca_fingerprint: str) -> bool:
        """Whether the CA with this fingerprint (hex SHA-256) is the code's."""
        try:
            full = bytes.fromhex(ca_fingerprint)
        except ValueError:
            return False
        return len(full) == 32 and secrets.compare_digest(full[:CA_BYTES], self.ca_prefix)

    def _key(self) -> Ed25519PrivateKey:
        seed = HKDF(
            algorithm=hashes.SHA256(),
            length=32,
            salt=None,
            info=b"letsinfer join code v1|" + self.code_id.encode(),
        ).derive(self.secret)
        return Ed25519PrivateKey.from_private_bytes(seed)

    @property
    def verifier(self) -> str:
        """What the main keeps (hex): checks a proof, proves nothing itself."""
        return (
            self._key()
            .public_key()
            .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            .hex()
        )

    def prove(self, *, nonce: str, csr_pem: str, ca_fingerprint: str, main_id: str) -> str:
        body = proof_message(
            code_id=self.code_id,
            nonce=nonce,
            csr_pem=csr_pem,
            ca_fingerprint=ca_fingerprint,
            main_id=main_id,
        )
        return self._key().sign(body).hex()


def proof_message(
    *, code_id: str, nonce: str, csr_pem: str, ca_fingerprint: str, main_id: str
) -> bytes:
    """The signed bytes: the code, the main's nonce, the CSR and the main it checked."""
    fields = {
        "code_id": code_id,
        "nonce": nonce,
        "csr_sha256": hashlib.sha256(csr_pem.encode()).hexdigest(),
        "ca_sha256": ca_fingerprint,
        "main_id": main_id,
    }
    return _PROOF_CONTEXT + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def proof_holds(verifier: str, proof: str, body: bytes) -> bool:
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(verifier))
        key.verify(bytes.fromhex(proof), body)
    except (ValueError, InvalidSignature):
        return False
    return True
