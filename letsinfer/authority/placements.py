"""Desired placements per node, as the authority holds them, for the agents."""

from __future__ import annotations

from typing import Any

from letsinfer.authority import engine_keys
from letsinfer.contracts.placement import DesiredPlacement
from letsinfer.engines.parallel_command import GroupTask
from letsinfer.engines.releases import Release
from letsinfer.store import AuthorityStore, PgTaskRecord, StoreError


def release_of(row: dict[str, Any]) -> Release:
    return Release(
        id=row["id"],
        engine=row["engine"],
        version=row["version"],
        target=row["target"],
        artifacts=row["artifacts"],
        launch=row["launch"],
    )


def group_of(store: AuthorityStore, pg_id: str) -> tuple[GroupTask, ...]:
    """A parallel group's tasks, head first, as every task is told; empty for a
    single-task group (its one task picks its own port)."""
    tasks = store.pg_tasks(pg_id)
    if len(tasks) < 2:
        return ()
    out = []
    for t in tasks:
        node = store.get_node(t.node_id)  # the group's nodes only, whatever the cluster's size
        if t.address is None or t.port is None or node is None or node.address is None:
            raise StoreError(f"task {t.task} of {pg_id} has no data address or port")
        out.append(GroupTask(t.task, t.node_id, t.address, t.port, node.address))
    return tuple(out)


def desired_for_node(
    store: AuthorityStore,
    node_id: str,
    secret: bytes,
    tasks: list[PgTaskRecord] | None = None,
) -> list[DesiredPlacement]:
    """``tasks``: the node's tasks when the caller read them already."""
    out = []
    for task in store.tasks_on_node(node_id) if tasks is None else tasks:
        pg = store.get_placement_group(task.pg_id)
        if pg is None or pg.desired != "running":
            continue
        svc = store.get_service(pg.service)
        rel = store.get_release(pg.release_id)
        if svc is None or rel is None:
            continue
        group = group_of(store, pg.id)
        out.append(
            DesiredPlacement(
                pg_id=pg.id,
                service=svc.name,
                artifact_digest=pg.artifact_digest or svc.artifact_digest,
                release=release_of(rel),
                engine_key=engine_keys.derive(secret, pg.id, task.task),
                gpu_uuids=tuple(store.task_gpus(pg.id, task.task)),
                release_signature=rel["signature"],
                task=task.task,
                port=task.port if group else None,
                group=group,
                group_key=engine_keys.derive(secret, pg.id, "group") if group else None,
                generation=pg.generation,
                proof=svc.kind,
                adapters=_adapters(store, pg.id, svc.name),
            )
        )
    return out


def _adapters(store: AuthorityStore, pg_id: str, service: str) -> tuple[tuple[str, str], ...]:
    """What the group's engine loads: its model's adapters, or, while they change
    and its turn to restart has not come, those it was launched with."""
    pinned = store.pinned_adapters(pg_id)
    if pinned is not None:
        return pinned
    return tuple((a.name, a.artifact_digest) for a in store.list_adapters(service))
