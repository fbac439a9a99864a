"""One line in the node's log for every audit record: each lifecycle, key,
model and membership change (pause, resume, stop, start, key create and
revoke, model add and remove, cluster stop...) and each aggregated refusal,
whoever made it: the CLI through the admin socket or writing the authority
itself, a controller, a child. Audit records never hold a secret, so these
lines never do either.

The running node reads the records appended since it last looked; nothing on
a request path waits for it.
"""

from __future__ import annotations

import asyncio
import logging

from letsinfer.store import AuditRecord, AuthorityStore

log = logging.getLogger("letsinfer.audit")


def line(r: AuditRecord) -> str:
    target = f" {r.target}" if r.target else ""
    role = f" ({r.role})" if r.role else ""
    detail = f": {r.detail}" if r.detail else ""
    count = f" x{r.count}" if r.count and r.count > 1 else ""
    return f"{r.action}{target} by {r.actor}{role}: {r.outcome}{count}{detail}"


class AuditEcho:
    def __init__(self, store: AuthorityStore, interval_s: float = 0.5) -> None:
        self.store = store
        self.interval_s = interval_s
        tail = store.audit_tail()
        self.seen = tail[0] if tail else 0  # history is not repeated at each start

    def echo(self) -> int:
        """Log what was appended since the last call; how many records."""
        records = self.store.audit_after(self.seen)
        for r in records:
            level = logging.WARNING if r.outcome not in ("ok",) else logging.INFO
            log.log(level, "%s", line(r))
        if records:
            self.seen = records[-1].seq
        return len(records)

    async def run(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.echo()
                failing = False
            except Exception:  # said once; a later round catches up
                if not failing:
                    log.exception("could not read the audit chain for the log")
                failing = True
