"""The desired-placement record: what the main tells a node to run, one
placement-group task each, and its wire form (the answer to a child's facts).

The main builds it from the authority (authority/placements.py); the same
record drives the main's own engines and, after the wire, a child's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from letsinfer.engines.parallel_command import GroupTask
from letsinfer.engines.releases import Release


@dataclass(frozen=True)
class DesiredPlacement:
    pg_id: str
    service: str
    artifact_digest: str
    release: Release
    engine_key: str
    gpu_uuids: tuple[str, ...] = ()
    threads: int = 2
    context: int = 4096
    parallel: int = 4
    release_signature: str | None = None
    # Parallel groups: which task this node runs, on which fixed port, the whole
    # group (head first) and the group's shared secret. A single-task group has
    # task "0", no fixed port, no group.
    task: str = "0"
    port: int | None = None
    group: tuple[GroupTask, ...] = ()
    group_key: str | None = None
    generation: int = 0  # raised by the main to start the engine afresh
    proof: str = "completion"  # what proves the engine serves (engines/proof.py)
    # The model's LoRA adapters as (name, artifact digest), in load order: the
    # engine loads them unapplied, and a request's adapter id is its index here.
    adapters: tuple[tuple[str, str], ...] = ()

    @property
    def peers(self) -> tuple[GroupTask, ...]:
        """The group's other tasks: the data links this task needs."""
        return tuple(t for t in self.group if t.task != self.task)

    def fingerprint(self) -> str:
        """Everything an engine is launched from: an adopted engine launched for
        another fingerprint (a new release, other GPUs, other sizing) is replaced."""
        data = asdict(self)
        if not self.adapters:  # as before adapters existed: adopted engines stay adopted
            del data["adapters"]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.adapters)

    def digests(self) -> tuple[str, ...]:
        """Every artifact its engine reads: the model, then its adapters."""
        return (self.artifact_digest, *(digest for _, digest in self.adapters))

    def serves_api(self) -> bool:
        """Task 0 answers the API (with the engine key); other tasks only /health."""
        return self.task == "0"


def to_wire(d: DesiredPlacement) -> dict[str, Any]:
    data = asdict(d)
    data["gpu_uuids"] = list(d.gpu_uuids)
    data["group"] = [asdict(t) for t in d.group]
    data["adapters"] = [list(a) for a in d.adapters]
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
        task=str(data.get("task", "0")),
        port=data.get("port"),
        group=tuple(GroupTask(**t) for t in data.get("group", [])),
        group_key=data.get("group_key"),
        generation=int(data.get("generation", 0)),
        proof=str(data.get("proof", "completion")),
        adapters=tuple((str(name), str(digest)) for name, digest in data.get("adapters", [])),
    )
