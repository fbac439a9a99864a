"""Desired placements per node, as the authority holds them, for the agents."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from letsinfer.agent.placement import DesiredPlacement
from letsinfer.authority import engine_keys
from letsinfer.engines.releases import Release
from letsinfer.store import AuthorityStore


def release_of(row: dict[str, Any]) -> Release:
    return Release(
        id=row["id"],
        engine=row["engine"],
        version=row["version"],
        target=row["target"],
        artifacts=row["artifacts"],
        launch=row["launch"],
    )


def desired_for_node(store: AuthorityStore, node_id: str, secret: bytes) -> list[DesiredPlacement]:
    out = []
    for pg in store.list_placement_groups(node_id=node_id):
        if pg.desired != "running":
            continue
        svc = store.get_service(pg.service)
        rel = store.get_release(pg.release_id)
        if svc is None or rel is None:
            continue
        out.append(
            DesiredPlacement(
                pg_id=pg.id,
                service=svc.name,
                artifact_digest=svc.artifact_digest,
                release=release_of(rel),
                engine_key=engine_keys.derive(secret, pg.id, "0"),
                gpu_uuids=tuple(store.pg_gpus(pg.id)),
                release_signature=rel["signature"],
            )
        )
    return out


def to_wire(d: DesiredPlacement) -> dict[str, Any]:
    data = asdict(d)
    data["gpu_uuids"] = list(d.gpu_uuids)
    return data


def from_wire(data: dict[str, Any], threads: int, context: int, parallel: int) -> DesiredPlacement:
    """A child applies its own engine sizing (it knows its CPUs), not the main's."""
    return DesiredPlacement(
        pg_id=data["pg_id"],
        service=data["service"],
        artifact_digest=data["artifact_digest"],
        release=Release(**data["release"]),
        engine_key=data["engine_key"],
        gpu_uuids=tuple(data["gpu_uuids"]),
        threads=threads,
        context=context,
        parallel=parallel,
        release_signature=data.get("release_signature"),
    )
