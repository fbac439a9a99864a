"""The tamper-evident audit chain: each record's hash covers the previous one.

Records hold who did what to which target and the outcome; never secrets,
keys, prompts or responses. A record that stands for several refusals of the
same kind (see letsinfer.audit.denials) carries their ``count``, covered
by its hash. The chain alone proves nothing against a writer of the database;
letsinfer.audit.anchor signs its head.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

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
    count: int | None


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
    count: int | None = None,
) -> str:
    fields: list[object] = [prev_hash, seq, repr(ts), actor, role, action, target, outcome, detail]
    if count is not None:  # records before counts existed hash as they always did
        fields.append(count)
    body = json.dumps(fields, separators=(",", ":"))
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
            rec.count,
        )
        if actual != rec.hash:
            return ChainBreak(rec.seq, "content does not match its hash (edited)")
        expected_prev = rec.hash
        expected_seq += 1
    return None
