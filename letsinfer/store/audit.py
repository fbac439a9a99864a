"""The audit chain's SQL: appending linked records, reading them, the chain's
tail for the signed head, and the open windows that aggregate denials.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class),
kept apart because the chain has rules of its own: every append happens in a
transaction, and the store tells its head keeper once that transaction
commits (see letsinfer.audit.anchor).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from letsinfer.audit.chain import GENESIS, record_hash


@dataclass(frozen=True)
class AuditRecord:
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
    count: int | None = None  # refusals this record stands for (aggregated denials)


@dataclass(frozen=True)
class Denial:
    """Refusals of one kind from one source, counted since they were last written."""

    source: str
    action: str
    reason: str
    count: int = 1


class ChainTail(Protocol):
    def audit_tail(self) -> tuple[int, str] | None: ...
    def audit_hash_at(self, seq: int) -> str | None: ...


class HeadKeeper(Protocol):
    """Signs the chain's head after every commit that appended to it."""

    def advance(self, chain: ChainTail) -> None: ...


class AuditTables:
    if TYPE_CHECKING:
        _audit_appended: bool

        def transaction(self) -> AbstractContextManager[None]: ...

        def _rows(
            self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()
        ) -> list[dict[str, Any]]: ...

        def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...

    def append_audit(
        self,
        actor: str,
        action: str,
        outcome: str,
        *,
        role: str | None = None,
        target: str | None = None,
        detail: str | None = None,
        count: int | None = None,
    ) -> AuditRecord:
        with self.transaction():
            last = self.audit_tail()
            seq = last[0] + 1 if last else 1
            prev = last[1] if last else GENESIS
            ts = time.time()
            digest = record_hash(prev, seq, ts, actor, role, action, target, outcome, detail, count)
            rec = AuditRecord(
                seq, ts, actor, role, action, target, outcome, detail, prev, digest, count
            )
            self._execute(
                "INSERT INTO audit(seq, ts, actor, role, action, target, outcome, detail, "
                "prev_hash, hash, count) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (seq, ts, actor, role, action, target, outcome, detail, prev, digest, count),
            )
            self._audit_appended = True
        return rec

    def list_audit(self, limit: int | None = None) -> list[AuditRecord]:
        if limit is None:
            rows = self._rows("SELECT * FROM audit ORDER BY seq")
        else:
            rows = self._rows(
                "SELECT * FROM (SELECT * FROM audit ORDER BY seq DESC LIMIT ?) ORDER BY seq",
                (limit,),
            )
        return [AuditRecord(**r) for r in rows]

    def audit_after(self, seq: int, limit: int = 1000) -> list[AuditRecord]:
        """Records appended after ``seq``, oldest first (at most ``limit``)."""
        rows = self._rows("SELECT * FROM audit WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))
        return [AuditRecord(**r) for r in rows]

    def audit_tail(self) -> tuple[int, str] | None:
        """(seq, hash) of the last record, or None for an empty chain."""
        rows = self._rows("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1")
        return (rows[0]["seq"], rows[0]["hash"]) if rows else None

    def audit_hash_at(self, seq: int) -> str | None:
        rows = self._rows("SELECT hash FROM audit WHERE seq = ?", (seq,))
        return rows[0]["hash"] if rows else None

    # -- denials, aggregated per source, action and reason per window -------
    def record_denials(self, denials: Iterable[Denial], now: float, interval_s: float) -> None:
        """The first refusal of a kind opens a window and is written at once (with
        the refusals counted with it); later ones in that window only add to its
        count, which :meth:`close_denial_windows` writes when the window ends
        (here too, first)."""
        denials = list(denials)
        if not denials:
            self.close_denial_windows(now, interval_s)
            return
        with self.transaction():
            self.close_denial_windows(now, interval_s)
            for d in denials:
                opened = self._execute(
                    "UPDATE denial_windows SET held = held + ? "
                    "WHERE source = ? AND action = ? AND reason = ?",
                    (d.count, d.source, d.action, d.reason),
                ).rowcount
                if opened:
                    continue
                self._execute(
                    "INSERT INTO denial_windows(source, action, reason, opened_at, held) "
                    "VALUES (?, ?, ?, ?, 0)",
                    (d.source, d.action, d.reason, now),
                )
                self.append_audit(d.source, d.action, "denied", detail=d.reason, count=d.count)

    def close_denial_windows(self, now: float, interval_s: float) -> int:
        """Write the count of every window that has ended; a window that saw
        refusals continues (so a steady flood costs one record per interval),
        an empty one closes. Returns the records written."""
        written = 0
        query = "SELECT 1 FROM denial_windows WHERE opened_at <= ? LIMIT 1"
        if not self._rows(query, (now - interval_s,)):
            return 0  # the common case: a read, no write lock taken
        with self.transaction():
            ended = self._rows(
                "SELECT * FROM denial_windows WHERE opened_at <= ?", (now - interval_s,)
            )
            for w in ended:
                key = (w["source"], w["action"], w["reason"])
                if w["held"]:
                    self.append_audit(
                        w["source"], w["action"], "denied", detail=w["reason"], count=w["held"]
                    )
                    written += 1
                    self._execute(
                        "UPDATE denial_windows SET opened_at = ?, held = 0 "
                        "WHERE source = ? AND action = ? AND reason = ?",
                        (now, *key),
                    )
                else:
                    self._execute(
                        "DELETE FROM denial_windows WHERE source = ? AND action = ? AND reason = ?",
                        key,
                    )
        return written
