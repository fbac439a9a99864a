"""``key.budget_exhausted`` and ``project.budget_exhausted``: the gateway
counts budgets in memory, on its own loop, so this watch runs there too, as a
background task (never in a request): each round it asks which keys and
projects have spent their budget and queues an event once per key (or
project) and period (the event's id names both, so a restart that finds the
budget still spent queues nothing new)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from letsinfer.webhooks.events import Queue, emit, iso

log = logging.getLogger("letsinfer.webhooks")


class Budgets(Protocol):
    def budgets_spent(self) -> list[tuple[str, Any, float]]: ...


class BudgetWatch:
    def __init__(self, gateway: Budgets, store: Queue, interval_s: float) -> None:
        self.gateway = gateway
        self.store = store
        self.interval_s = interval_s
        self._queued: set[str] = set()

    def check(self) -> int:
        """Queue the newly spent budgets' events; how many."""
        new = 0
        for scope, limits, start in self.gateway.budgets_spent():
            # A project's shared limits are counted as the scope "project:NAME"
            # (a name no key can have): its own event, so a subscriber can tell
            # one key's budget from a whole project's.
            kind, _, project = scope.partition(":")
            if kind == "project" and project:
                event, about = "project.budget_exhausted", {"project": project}
            else:
                event, about = "key.budget_exhausted", {"key": scope}
            event_id = f"{event}:{scope}:{int(start)}"
            if event_id in self._queued:
                continue
            emit(
                self.store,
                event_id,
                event,
                {
                    **about,
                    "budget_tokens": limits.budget,
                    "period": limits.period,
                    "period_start": iso(start),
                },
            )
            self._queued.add(event_id)
            new += 1
        return new

    async def run(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.check()
                failing = False
            except Exception:  # said once; a later round tries again
                if not failing:
                    log.exception("webhooks: could not queue spent budgets")
                failing = True
