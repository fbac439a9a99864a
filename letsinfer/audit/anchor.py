"""The audit chain's anchor: its head (record count and last hash) signed with
the node key after every append, and kept under the node's etc/ (0700), apart
from the database.

What it answers: a writer of the authority database (the ``letsinfer`` group,
which may write the 0660 file but can neither read the node key nor write
under etc/) who cuts the chain's tail, or edits a record and recomputes every
later hash. Neither matches the signed head any more, and a child's head also
travels with its signed facts, so its main notices too. What it does not
answer: root on the node, or anyone holding the node key; they can sign any
head they like.

Who appends: the node process and the CLI run as root sign; a process that
cannot read the key (a group member's CLI with no node running) appends
unsigned, and its records stay "not anchored yet" until the next signed
append covers them. Before signing, the stored head is checked against the
database in O(1) (the record it names must still hold its hash): on a
mismatch nothing is signed again, so the evidence stays, and it is logged.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.home import Home
from letsinfer.store import AuthorityStore, ChainTail, NodeRecord, Witness
from letsinfer.trust import pki

log = logging.getLogger("letsinfer.audit")

# Signed bytes start with this label, so a head's signature can never be
# taken for a signature over anything else the node key signs (facts, CSRs).
_DOMAIN = b"letsinfer-audit-head/1\n"
_HASH = re.compile(r"[0-9a-f]{64}")
MAX_COUNT = 2**62


class AnchorError(Exception):
    """The signed head cannot be read or does not verify."""


@dataclass(frozen=True)
class SignedHead:
    count: int  # records the head covers (the last one's seq)
    hash: str  # that record's hash
    signature: str  # base64 ECDSA P-256 (SHA-256) over signed_bytes(count, hash)

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "hash": self.hash, "signature": self.signature}

    @classmethod
    def from_json(cls, data: object) -> SignedHead:
        if not isinstance(data, dict):
            raise AnchorError("the signed head is not an object")
        count, digest, sig = data.get("count"), data.get("hash"), data.get("signature")
        if type(count) is not int or not 1 <= count <= MAX_COUNT:
            raise AnchorError(f"the signed head's count is not a record number: {count!r}")
        if not isinstance(digest, str) or not _HASH.fullmatch(digest):
            raise AnchorError("the signed head's hash is not a sha256 hex digest")
        if not isinstance(sig, str) or len(sig) > 256:
            raise AnchorError("the signed head's signature is malformed")
        return cls(count, digest, sig)


def signed_bytes(count: int, digest: str) -> bytes:
    return _DOMAIN + f"{count}:{digest}".encode()


def sign_head(key: ec.EllipticCurvePrivateKey, count: int, digest: str) -> SignedHead:
    sig = key.sign(signed_bytes(count, digest), ec.ECDSA(hashes.SHA256()))
    return SignedHead(count, digest, base64.b64encode(sig).decode())


def signature_valid(head: SignedHead, public_key: ec.EllipticCurvePublicKey) -> bool:
    try:
        sig = base64.b64decode(head.signature, validate=True)
        public_key.verify(sig, signed_bytes(head.count, head.hash), ec.ECDSA(hashes.SHA256()))
    except (ValueError, InvalidSignature):
        return False
    return True


def head_problem(head: SignedHead, chain: ChainTail) -> str | None:
    """What is wrong with the database against the signed head, in O(1): the
    record the head names must still be there with the same hash."""
    at = chain.audit_hash_at(head.count)
    if at is None:
        tail = chain.audit_tail()
        ends = f"ends at record {tail[0]}" if tail else "is empty"
        return (
            f"the chain was cut: the signed head covers {head.count} records, "
            f"but the database {ends}"
        )
    if at != head.hash:
        return (
            f"record {head.count} differs from the signed head: the chain was rewritten "
            "(records changed and their hashes recomputed)"
        )
    return None


class HeadAnchor:
    """Keeps the signed head of one home's audit chain (a store's HeadKeeper)."""

    def __init__(self, head_file: Path, key_file: Path) -> None:
        self.head_file = head_file
        self.key_file = key_file
        self._key: ec.EllipticCurvePrivateKey | None = None
        self._reported: set[str] = set()

    @classmethod
    def for_home(cls, home: Home) -> HeadAnchor:
        return cls(home.audit_head, home.node_key)

    def signing_key(self) -> ec.EllipticCurvePrivateKey | None:
        """The node key, or None where this process may not read it."""
        if self._key is None:
            try:
                self._key = pki.read_private_key(self.key_file)
            except (OSError, ValueError, pki.CertificateError):
                return None
        return self._key

    def read(self) -> SignedHead | None:
        """The stored head; None when there is none yet. Raises AnchorError."""
        try:
            raw = self.head_file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise AnchorError(f"cannot read the signed head {self.head_file}: {exc}") from exc
        try:
            return SignedHead.from_json(json.loads(raw))
        except ValueError as exc:
            raise AnchorError(f"the signed head {self.head_file} is not JSON") from exc

    def advance(self, chain: ChainTail) -> None:
        """Sign the chain's current tail, if this process can and the stored
        head still matches the database. Never raises over a problem it finds:
        the caller's change is committed already."""
        key = self.signing_key()
        if key is None:
            return  # records after the head stay "not anchored yet"
        with self._locked():
            try:
                head = self.read()
            except AnchorError as exc:
                self._loud(str(exc))
                return
            tail = chain.audit_tail()
            if tail is None:
                return
            if head is not None:
                problem = head_problem(head, chain)
                if problem is not None:
                    self._loud(problem)
                    return
                if tail[0] <= head.count:
                    return
            self._write(sign_head(key, *tail))

    def _loud(self, problem: str) -> None:
        if problem in self._reported:
            return
        self._reported.add(problem)
        log.error(
            "the audit chain does not match its signed head (%s); no new head is signed "
            "until this is resolved: run `letsinfer audit verify`",
            problem,
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Several processes with the key (the node, a root CLI) append: one
        # writes the head at a time, so it never goes backwards.
        self.head_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.head_file.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, head: SignedHead) -> None:
        tmp = self.head_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(head.to_json(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(self.head_file)


def open_authority(home: Home) -> AuthorityStore:
    """The home's authority store, its audit chain anchored by the node key."""
    return AuthorityStore(home.database, anchor=HeadAnchor.for_home(home))


# -- checking ------------------------------------------------------------------
@dataclass(frozen=True)
class AnchorCheck:
    head: SignedHead | None
    problems: list[str]  # what is forged, cut or rewritten
    unanchored: int  # records after the signed head (appended without the key)


def check_anchor(anchor: HeadAnchor, chain: ChainTail) -> AnchorCheck:
    """The full check ``audit verify`` makes of the head: readable, signed by
    this node's key, and naming a record the database still holds unchanged."""
    tail = chain.audit_tail()
    count = tail[0] if tail else 0
    try:
        head = anchor.read()
    except AnchorError as exc:
        return AnchorCheck(None, [str(exc)], count)
    if head is None:
        if count == 0:
            return AnchorCheck(None, [], 0)
        return AnchorCheck(
            None,
            [
                f"there is no signed head ({anchor.head_file}): none of the {count} records is "
                "anchored"
            ],
            count,
        )
    key = anchor.signing_key()
    if key is None:
        return AnchorCheck(
            head,
            [
                f"cannot read the node key {anchor.key_file} to check the head's signature "
                "(run as root)"
            ],
            max(0, count - head.count),
        )
    if not signature_valid(head, key.public_key()):
        return AnchorCheck(
            head,
            ["the signed head's signature does not verify with this node's key (forged)"],
            count,
        )
    problem = head_problem(head, chain)
    return AnchorCheck(head, [problem] if problem else [], max(0, count - head.count))


# -- a child's head, reported with its facts and witnessed by the main ----------
def head_report(anchor: HeadAnchor, chain: ChainTail) -> dict[str, Any] | None:
    """What a child sends with its facts: its stored signed head and what the
    O(1) check against its database finds; None before the first head."""
    try:
        head = anchor.read()
    except AnchorError as exc:
        log.error("%s", exc)
        return None
    if head is None:
        return None
    return {**head.to_json(), "problem": head_problem(head, chain)}


def witness(node: NodeRecord, head: SignedHead, problem: str | None) -> Witness:
    """The main's judgement of a child's reported head (its signature checked
    already, with the facts): a head behind the one witnessed before, or
    another hash at the same count, is flagged and the witnessed head kept."""
    if node.audit_head is not None:
        try:
            old = SignedHead.from_json(node.audit_head)
        except AnchorError:
            old = None
        if old is not None and (
            head.count < old.count or (head.count == old.count and head.hash != old.hash)
        ):
            return Witness(
                old.to_json(),
                f"its signed audit head went backwards: the main witnessed record {old.count} "
                f"({old.hash[:12]}), now it reports record {head.count} ({head.hash[:12]})",
            )
    return Witness(head.to_json(), problem)
