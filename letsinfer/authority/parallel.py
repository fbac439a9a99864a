"""Parallel placement groups: several tasks, one endpoint, published atomically.

A parallel group's endpoint (task "0", the head) reaches routing only when
every task of the group reports ready in fresh facts; if any task is not
ready, the whole group is withdrawn. Core never splits a single-device runtime:
a one-task group is an ordinary group.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskReport:
    node_id: str
    state: str
    base_url: str | None
    capacity: int | None = None
    detail: str | None = None
    adapters: tuple[str, ...] = ()  # the LoRA adapters its engine loaded, in order
    adapter_digests: tuple[str, ...] = ()  # their files' (empty from an older agent)


@dataclass
class TaskBoard:
    """The latest report of every task, per placement group."""

    reports: dict[str, dict[str, TaskReport]] = field(default_factory=dict)

    def report(self, pg_id: str, task: str, rep: TaskReport) -> None:
        self.reports.setdefault(pg_id, {})[task] = rep

    def forget_node(self, node_id: str) -> None:
        for tasks in self.reports.values():
            for task in [t for t, r in tasks.items() if r.node_id == node_id]:
                del tasks[task]

    def parked(self, pg_id: str) -> TaskReport | None:
        """A task whose engine is parked: the group cannot serve until it is unparked."""
        return next((r for r in self.reports.get(pg_id, {}).values() if r.state == "parked"), None)

    def head(self, pg_id: str) -> TaskReport | None:
        return self.reports.get(pg_id, {}).get("0")

    def endpoint(self, pg_id: str, expected: set[str]) -> str | None:
        """The head's URL if, and only if, every expected task is ready."""
        tasks = self.reports.get(pg_id, {})
        if not expected or not expected <= set(tasks):
            return None
        if any(tasks[t].state != "ready" for t in expected):
            return None
        return tasks["0"].base_url if "0" in tasks else None

    def waiting_for(self, pg_id: str, expected: set[str]) -> list[str]:
        tasks = self.reports.get(pg_id, {})
        return sorted(t for t in expected if t not in tasks or tasks[t].state != "ready")
