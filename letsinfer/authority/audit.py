"""The tamper-evident audit chain: each record's hash covers the previous one.

Records hold who did what to which target and the outcome; never secrets,
keys, prompts or responses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from letsinfer.trust.handshake import RefusalLog

GENESIS = "0" * 64


class ChainedRecord(Protocol):
    seq: int
    ts: float
    actor: str
    role: str | None
    action: str
    target: str | None
    outcome: str
    detail: str | None
    prev_hash: str
    hash: str


def record_hash(
    prev_hash: str,
    seq: int,
    ts: float,
    actor: str,
    role: str | None,
    action: str,
    target: str | None,
    outcome: str,
    detail: str | None,
) -> str:
    body = json.dumps(
        [prev_hash, seq, repr(ts), actor, role, action, target, outcome, detail],
        separators=(",", ":"),
    )
    return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True)
class ChainBreak:
    seq: int
    reason: str


def verify_chain(records: Iterable[ChainedRecord]) -> ChainBreak | None:
    """Return the first broken link, or None when the whole chain holds."""
    expected_prev = GENESIS
    expected_seq = 1
    for rec in records:
        if rec.seq != expected_seq:
            return ChainBreak(
                rec.seq, f"expected record {expected_seq} here (deleted or reordered)"
            )
        if rec.prev_hash != expected_prev:
            return ChainBreak(rec.seq, "does not link to the previous record")
        actual = record_hash(
            rec.prev_hash,
            rec.seq,
            rec.ts,
            rec.actor,
            rec.role,
            rec.action,
            rec.target,
            rec.outcome,
            rec.detail,
        )
        if actual != rec.hash:
            return ChainBreak(rec.seq, "content does not match its hash (edited)")
        expected_prev = rec.hash
        expected_seq += 1
    return None


class AuditSink(Protocol):
    def append_audit(
        self,
        actor: str,
        action: str,
        outcome: str,
        *,
        role: str | None = None,
        target: str | None = None,
        detail: str | None = None,
    ) -> object: ...


def handshake_refusals(store: AuditSink, plane: str) -> Callable[[str, str], None]:
    """``on_refused`` for a mutual-TLS plane: each refused handshake (rate-limited
    per address and reason) becomes a denial in the chain."""

    def audit(address: str, reason: str, count: int) -> None:
        detail = reason if count == 1 else f"{reason} (x{count} since the last record)"
        store.append_audit(f"tls:{address}", f"{plane}:handshake", "denied", detail=detail)

    return RefusalLog(audit).refused
