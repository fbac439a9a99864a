"""From verified facts to what the gateway's replica choice weighs.

Per placement group: the free slots and queue depth its serving task's
engine reported (task 0; its agent read them from the engine), the hottest of
the group's GPUs on any of its nodes, and when the oldest of those facts
arrived (a group is as fresh as its stalest node).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

from letsinfer.authority.facts import NodeView
from letsinfer.gateway.routing import ReplicaFacts


class _Gpu(Protocol):
    @property
    def uuid(self) -> str: ...

    @property
    def temperature_c(self) -> int | None: ...


def hottest(gpus: Iterable[_Gpu], uuids: Collection[str]) -> float | None:
    """The highest temperature among the GPUs ``uuids`` names (None: none said)."""
    temps = [g.temperature_c for g in gpus if g.uuid in uuids and g.temperature_c is not None]
    return float(max(temps)) if temps else None


def group_facts(
    pg_id: str,
    tasks: Sequence[tuple[str, str, Collection[str]]],
    views: Mapping[str, NodeView],
) -> ReplicaFacts | None:
    """``tasks``: (task, node id, GPU UUIDs) of each of the group's tasks.
    None while a node of the group has sent no accepted facts."""
    at: float | None = None
    temps: list[float] = []
    slots_free = queue_depth = None
    for task, node_id, uuids in tasks:
        view = views.get(node_id)
        if view is None:
            return None
        at = view.received_at if at is None else min(at, view.received_at)
        hot = hottest(view.facts.gpus, uuids)
        if hot is not None:
            temps.append(hot)
        if task == "0":
            for p in view.facts.placements:
                if p.pg_id == pg_id and p.task == "0":
                    slots_free, queue_depth = p.slots_free, p.queue_depth
    if at is None:
        return None
    return ReplicaFacts(
        at=at,
        slots_free=slots_free,
        queue_depth=queue_depth,
        temperature_c=max(temps) if temps else None,
    )
