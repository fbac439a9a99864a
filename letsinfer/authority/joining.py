"""The main's side of join codes: a code out, a proof and a CSR back, a node in.

`letsinfer node add --code` keeps the code's id and the public verifier of
its secret (letsinfer.trust.join_code). A candidate that checked this main's
CA against the code asks for a nonce, then sends its CSR with a proof
(a signature by the key the secret seeds, over the nonce and the CSR).
Guesses are bounded twice: a code is burnt at MAX_WRONG_PROOFS wrong proofs,
and past GLOBAL_WRONG_PROOFS wrong proofs or unknown codes within
GLOBAL_WINDOW_S every join is refused (429) until the window has moved on.
Codes expire and work once. A use, a code made and a code burnt are audit
records of their own; other refusals go through the denial log (a flood adds
a bounded number of records).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.x509.oid import NameOID

from letsinfer.store import AuthorityStore, StoreError
from letsinfer.store.join_codes import BURNT, OPEN, USED, JoinCodeRecord
from letsinfer.trust import pki
from letsinfer.trust.join_code import JoinCode, proof_holds, proof_message
from letsinfer.trust.material import ClusterCA

MAX_WRONG_PROOFS = 5
GLOBAL_WRONG_PROOFS = 30
GLOBAL_WINDOW_S = 600.0
NONCE_TTL_S = 120.0
MAX_TTL_S = 7 * 86400.0
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]{1,253}):[0-9]{1,5}$")


class JoinRefused(Exception):
    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def issue_code(
    store: AuthorityStore,
    ca_fingerprint: str,
    ttl_s: float,
    actor: str = "cli",
    role: str = "main",
) -> tuple[JoinCode, JoinCodeRecord]:
    if not 0 < ttl_s <= MAX_TTL_S:
        raise StoreError(f"a join code lives between 1 second and 7 days, not {ttl_s:g}s")
    code = JoinCode.new(ca_fingerprint)
    with store.transaction():
        rec = store.add_join_code(code.code_id, code.verifier, ttl_s)
        store.append_audit(
            actor,
            "node.join.code",
            "ok",
            role=role,
            target=code.code_id,
            detail=f"ttl {ttl_s:g}s",
        )
    return code, rec


def join_code_issued(
    store: AuthorityStore,
    ca_fingerprint: str,
    ttl_s: float,
    control_address: str,
    actor: str = "cli",
    role: str = "main",
) -> dict[str, Any]:
    """`node add --code`, on the main and from a controller alike: a new
    code, its id, when it expires (a time) and the command that uses it."""
    code, rec = issue_code(store, ca_fingerprint, ttl_s, actor=actor, role=role)
    return {
        "code": str(code),
        "id": rec.id,
        "ca_fingerprint": ca_fingerprint,
        "expires_at": rec.expires_at,
        "join": f"letsinfer join {control_address} {code}",
    }


class Challenges:
    """Nonces for proofs, kept nowhere: each carries its time and a MAC by a
    key of this process, so the main tells its own fresh ones from others."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._key = secrets.token_bytes(32)
        self._clock = clock

    def _mac(self, stamp: str, salt: str) -> str:
        return hmac.new(self._key, f"{stamp}.{salt}".encode(), hashlib.sha256).hexdigest()[:32]

    def issue(self) -> str:
        stamp, salt = str(int(self._clock())), secrets.token_hex(8)
        return f"{stamp}.{salt}.{self._mac(stamp, salt)}"

    def fresh(self, nonce: str) -> bool:
        stamp, _, rest = nonce.partition(".")
        salt, _, mac = rest.partition(".")
        if not stamp.isdigit() or not hmac.compare_digest(mac, self._mac(stamp, salt)):
            return False
        return 0 <= self._clock() - int(stamp) <= NONCE_TTL_S


class GuessBudget:
    """Wrong proofs and unknown codes, from anyone, within the last window."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._spent: collections.deque[float] = collections.deque()

    def _trim(self) -> None:
        while self._spent and self._clock() - self._spent[0] > GLOBAL_WINDOW_S:
            self._spent.popleft()

    def retry_after(self) -> int | None:
        """None while guesses are allowed; else the seconds until one is."""
        self._trim()
        if len(self._spent) < GLOBAL_WRONG_PROOFS:
            return None
        return max(1, int(GLOBAL_WINDOW_S - (self._clock() - self._spent[0])) + 1)

    def spend(self) -> None:
        self._spent.append(self._clock())


@dataclass(frozen=True)
class JoinAsk:
    code_id: str
    nonce: str
    proof: str
    csr: str
    node_id: str
    name: str
    agent_address: str


@dataclass(frozen=True)
class Joined:
    node_id: str
    name: str
    certificate: bytes


def admit(
    store: AuthorityStore,
    ca: ClusterCA,
    main_id: str,
    challenges: Challenges,
    budget: GuessBudget,
    ask: JoinAsk,
    refused: Callable[[str], None],
) -> Joined:
    """Check everything, then record the node, use the code and issue the
    certificate in one step. ``refused(kind)`` counts a refusal for the audit
    chain (the denial log)."""

    def refuse(status: int, why: str, kind: str, retry: int | None = None) -> JoinRefused:
        refused(kind)
        return JoinRefused(status, why, retry)

    wait = budget.retry_after()
    if wait is not None:
        raise refuse(
            429,
            f"too many wrong join codes lately; try again in {wait}s",
            "join refused: too many wrong codes lately",
            wait,
        )
    if not challenges.fresh(ask.nonce):
        raise refuse(
            400, "the nonce is not a fresh one of this main: ask again", "join: stale nonce"
        )
    rec = store.get_join_code(ask.code_id)
    if rec is None:
        budget.spend()
        raise refuse(403, "unknown join code", "join: unknown code")
    if rec.state == USED:
        raise refuse(409, "this join code has been used already", "join: code used already")
    if rec.state == BURNT:
        raise refuse(
            403,
            "this join code is burnt (too many wrong proofs): make a new one",
            "join: code burnt",
        )
    if time.time() > rec.expires_at:
        raise refuse(
            410,
            "this join code has expired: make a new one (`letsinfer node add --code`)",
            "join: code expired",
        )
    body = proof_message(
        code_id=rec.id,
        nonce=ask.nonce,
        csr_pem=ask.csr,
        ca_fingerprint=pki.fingerprint(ca.cert),
        main_id=main_id,
    )
    if not proof_holds(rec.verifier, ask.proof, body):
        budget.spend()
        after = store.join_code_wrong_proof(rec.id, MAX_WRONG_PROOFS)
        if after.state == BURNT and rec.state == OPEN:
            store.append_audit(
                "anonymous",
                "node.join",
                "denied",
                target=rec.id,
                detail=f"join code burnt after {after.wrong_proofs} wrong proofs",
            )
        raise refuse(403, "wrong join code", "join: wrong proof")
    try:
        csr = pki.load_csr(ask.csr.encode())
    except pki.CertificateError as exc:
        raise refuse(400, str(exc), "join: malformed certificate request") from exc
    if (
        not _NODE_ID.match(ask.node_id)
        or not _NAME.match(ask.name)
        or not _ADDRESS.match(ask.agent_address)
    ):
        raise refuse(
            400, "a node id, name or agent address that cannot be one", "join: malformed identity"
        )
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [n.value for n in names] != [ask.node_id]:
        raise refuse(400, "the CSR names another node id", "join: malformed identity")
    _refuse_taken(store, ask, refuse)
    cert = ca.issue_node(csr.public_key(), ask.node_id)  # type: ignore[arg-type]
    fp = pki.fingerprint(pki.load_cert(cert))
    with store.transaction():
        if not store.join_code_used(rec.id, ask.node_id):
            raise refuse(409, "this join code has been used already", "join: code used already")
        try:
            store.add_node(ask.node_id, ask.name, "child", ask.agent_address, fp)
        except StoreError as exc:
            raise refuse(409, str(exc), "join: the node cannot be added") from exc
        store.append_audit(
            f"node:{ask.node_id}",
            "node.join",
            "ok",
            role="child",
            target=ask.name,
            detail=f"join code {rec.id}, agent at {ask.agent_address}",
        )
    return Joined(ask.node_id, ask.name, cert)


def _refuse_taken(
    store: AuthorityStore, ask: JoinAsk, refuse: Callable[[int, str, str], JoinRefused]
) -> None:
    """A name or id already here, or a removed identity: refused, the code kept."""
    if store.find_node(ask.node_id) is not None or store.find_node(ask.name) is not None:
        raise refuse(
            409,
            f"a node named {ask.name!r} or with id {ask.node_id} is already enrolled: "
            "join under another name (`letsinfer join --name`); the code still works",
            "join: name or id taken",
        )
    if store.get_node(ask.node_id, facts=False) is not None:
        raise refuse(
            409,
            f"node id {ask.node_id} was removed from this cluster and never returns: "
            "wipe this home and join with a new identity",
            "join: removed identity",
        )
