"""Placement groups' SQL: groups, their tasks and the GPUs they hold, what
their agents observed, and the data links between nodes.

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING, Any

from letsinfer.store.plumbing import Plumbing
from letsinfer.store.records import (
    GpuClaim,
    LinkRecord,
    PgTaskRecord,
    PlacementGroupRecord,
    StoreError,
    TaskSpec,
    _pg,
)


class GroupTables(Plumbing):
    if TYPE_CHECKING:

        def get_release(self, release_id: str) -> dict[str, Any] | None: ...

        def add_release_history(
            self, service: str, node_id: str, pg_id: str, release_id: str, event: str
        ) -> None: ...

    def add_placement_group(
        self,
        pg_id: str,
        service: str,
        node_id: str,
        release_id: str,
        target: str,
        gpu_uuids: tuple[str, ...] = (),
        event: str | None = "installed",
    ) -> PlacementGroupRecord:
        """A single-task group: its one task runs on ``node_id``."""
        return self.add_parallel_placement_group(
            pg_id,
            service,
            release_id,
            target,
            [TaskSpec("0", node_id, gpu_uuids=gpu_uuids)],
            event,
        )

    def add_parallel_placement_group(
        self,
        pg_id: str,
        service: str,
        release_id: str,
        target: str,
        tasks: list[TaskSpec],
        event: str | None = "installed",
    ) -> PlacementGroupRecord:
        """A group and all its tasks and GPUs, or nothing (one transaction).
        The group's ``node_id`` is its head's (task "0"); ``event`` names why
        in its release history (None: the caller records it once it serves)."""
        if not tasks or tasks[0].task != "0":
            raise StoreError("a placement group needs task 0 (its head) first")
        now = time.time()
        with self.transaction():
            self.db["placement_groups"].insert(
                {
                    "id": pg_id,
                    "service": service,
                    "node_id": tasks[0].node_id,
                    "release_id": release_id,
                    "target": target,
                    "desired": "running",
                    "state": "pending",
                    "restarts": 0,
                    "created_at": now,
                    "updated_at": now,
                }
            )
            for t in tasks:
                try:
                    self.db["pg_tasks"].insert(
                        {
                            "pg_id": pg_id,
                            "task": t.task,
                            "node_id": t.node_id,
                            "address": t.address,
                            "port": t.port,
                            "state": "pending",
                            "updated_at": now,
                        }
                    )
                except sqlite3.IntegrityError as exc:
                    raise StoreError(
                        f"task {t.task} of {pg_id} on node {t.node_id} conflicts: {exc}"
                    ) from exc
                for uuid in t.gpu_uuids:
                    try:
                        self.db["pg_devices"].insert(
                            {"gpu_uuid": uuid, "pg_id": pg_id, "node_id": t.node_id, "task": t.task}
                        )
                    except sqlite3.IntegrityError as exc:
                        raise StoreError(
                            f"GPU {uuid} already belongs to an active placement group"
                        ) from exc
            if event is not None:
                self.add_release_history(service, tasks[0].node_id, pg_id, release_id, event)
        pg = self.get_placement_group(pg_id)
        assert pg is not None
        return pg

    def get_placement_group(self, pg_id: str) -> PlacementGroupRecord | None:
        rows = self._rows("SELECT * FROM placement_groups WHERE id = ?", (pg_id,))
        return _pg(rows[0]) if rows else None

    def list_placement_groups(
        self,
        node_id: str | None = None,
        service: str | None = None,
    ) -> list[PlacementGroupRecord]:
        sql = "SELECT * FROM placement_groups WHERE 1=1"
        params: dict[str, Any] = {}
        if node_id is not None:
            sql += " AND node_id = :node"
            params["node"] = node_id
        if service is not None:
            sql += " AND service = :service"
            params["service"] = service
        return [_pg(r) for r in self._rows(sql + " ORDER BY created_at", params)]

    def parallel_groups(self) -> list[tuple[PlacementGroupRecord, list[PgTaskRecord]]]:
        """Every group meant to run with more than one task, with its tasks (the
        groups whose plans need data links): two queries, whatever the cluster's size."""
        groups = {
            r["id"]: _pg(r)
            for r in self._rows(
                "SELECT * FROM placement_groups WHERE desired = 'running' AND id IN "
                "(SELECT pg_id FROM pg_tasks GROUP BY pg_id HAVING COUNT(*) > 1) "
                "ORDER BY created_at"
            )
        }
        if not groups:
            return []
        marks = ", ".join("?" * len(groups))
        tasks: dict[str, list[PgTaskRecord]] = {g: [] for g in groups}
        for r in self._rows(
            f"SELECT * FROM pg_tasks WHERE pg_id IN ({marks}) "
            "ORDER BY pg_id, CAST(task AS INTEGER), task",
            tuple(groups),
        ):
            tasks[r["pg_id"]].append(PgTaskRecord(**r))
        return [(g, tasks[g.id]) for g in groups.values()]

    def pg_tasks(self, pg_id: str) -> list[PgTaskRecord]:
        rows = self._rows(
            "SELECT * FROM pg_tasks WHERE pg_id = ? ORDER BY CAST(task AS INTEGER), task", (pg_id,)
        )
        return [PgTaskRecord(**r) for r in rows]

    def tasks_on_node(self, node_id: str) -> list[PgTaskRecord]:
        rows = self._rows(
            "SELECT * FROM pg_tasks WHERE node_id = ? ORDER BY pg_id, task", (node_id,)
        )
        return [PgTaskRecord(**r) for r in rows]

    def task_ports_in_use(self, node_id: str) -> set[int]:
        rows = self._rows(
            "SELECT port FROM pg_tasks WHERE node_id = ? AND port IS NOT NULL", (node_id,)
        )
        return {int(r["port"]) for r in rows}

    def task_gpus(self, pg_id: str, task: str) -> list[str]:
        rows = self._rows(
            "SELECT gpu_uuid FROM pg_devices WHERE pg_id = ? AND task = ? ORDER BY gpu_uuid",
            (pg_id, task),
        )
        return [r["gpu_uuid"] for r in rows]

    def pg_gpus(self, pg_id: str) -> list[str]:
        rows = self._rows(
            "SELECT gpu_uuid FROM pg_devices WHERE pg_id = ? ORDER BY gpu_uuid", (pg_id,)
        )
        return [r["gpu_uuid"] for r in rows]

    def gpu_claims(self) -> list[GpuClaim]:
        """Every GPU held by a placement group, across the cluster."""
        rows = self._rows("SELECT gpu_uuid, pg_id, node_id, task FROM pg_devices ORDER BY gpu_uuid")
        return [GpuClaim(**r) for r in rows]

    def gpus_in_use(self, node_id: str) -> set[str]:
        rows = self._rows("SELECT gpu_uuid FROM pg_devices WHERE node_id = ?", (node_id,))
        return {r["gpu_uuid"] for r in rows}

    def record_pg_observation(
        self,
        pg_id: str,
        *,
        state: str,
        endpoint: str | None = None,
        pid: int | None = None,
        capacity: int | None = None,
        restarts: int | None = None,
        detail: str | None = None,
        generation: int | None = None,
    ) -> None:
        """What the agent saw (of ``generation``, when it says); desired state is
        never touched here."""
        fields: dict[str, Any] = {
            "state": state,
            "endpoint": endpoint,
            "pid": pid,
            "capacity": capacity,
            "detail": detail,
            "updated_at": time.time(),
        }
        if restarts is not None:
            fields["restarts"] = restarts
        if generation is not None:
            fields["observed_generation"] = generation
        sets = ", ".join(f"{k} = :{k}" for k in fields)
        self.db.execute(
            f"UPDATE placement_groups SET {sets} WHERE id = :id", {**fields, "id": pg_id}
        )

    def record_task_observation(
        self, pg_id: str, task: str, state: str, detail: str | None
    ) -> None:
        self.db.execute(
            "UPDATE pg_tasks SET state = ?, detail = ?, updated_at = ? "
            "WHERE pg_id = ? AND task = ?",
            (state, detail, time.time(), pg_id, task),
        )

    def set_pg_paused(self, pg_id: str, reason: str | None) -> None:
        self._set_on_groups([pg_id], "paused_reason = ?", reason)

    def set_service_desired(self, service: str, desired: str) -> int:
        cur = self.db.execute(
            "UPDATE placement_groups SET desired = ?, updated_at = ? WHERE service = ?",
            (desired, time.time(), service),
        )
        return cur.rowcount

    def set_groups_desired(self, pg_ids: list[str], desired: str) -> None:
        self._set_on_groups(pg_ids, "desired = ?", desired)

    def restart_groups(self, pg_ids: list[str]) -> None:
        """A new generation: each group's agent starts its engine afresh."""
        self._set_on_groups(pg_ids, "generation = generation + 1")

    def set_pg_release(self, pg_id: str, release_id: str) -> None:
        """The group runs another release from its next generation (the caller
        raises it, and records the release history once it serves)."""
        if self.get_release(release_id) is None:
            raise StoreError(f"no runtime release {release_id!r}")
        self._set_on_groups([pg_id], "release_id = ?", release_id)

    def _set_on_groups(self, pg_ids: list[str], sets: str, *values: Any) -> None:
        """``sets`` (SQL, its ``?`` filled by ``values``) on each group, which
        changed now."""
        for pg_id in pg_ids:
            self.db.execute(
                f"UPDATE placement_groups SET {sets}, updated_at = ? WHERE id = ?",
                (*values, time.time(), pg_id),
            )

    def delete_placement_group(self, pg_id: str) -> None:
        """Gone from the desired state; its GPUs are free again (cascade)."""
        self.db.execute("DELETE FROM placement_groups WHERE id = ?", (pg_id,))

    # -- data links ---------------------------------------------------------
    def list_links(self) -> list[LinkRecord]:
        return [LinkRecord(**r) for r in self._rows("SELECT * FROM links ORDER BY node_a, node_b")]

    def set_link_state(self, node_a: str, node_b: str, state: str) -> None:
        a, b = sorted((node_a, node_b))
        self.db.execute(
            "INSERT INTO links(node_a, node_b, state, changed_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(node_a, node_b) DO UPDATE SET state = excluded.state, "
            "changed_at = excluded.changed_at",
            (a, b, state, time.time()),
        )
