"""A group's engine starts afresh without its model going dark, where capacity allows.

`cluster restart` and `model adapter add/remove` (llama.cpp loads adapters
only when its server starts) restart groups one at a time. Where spare capacity
allows, the fresh engine is a new group with the same release started beside
the serving one, as upgrades do (rollout.swap_beside): once it is proven, the
old group drains and goes. Spare capacity: as many free GPUs on the group's
node as it holds (a cpu group holds none), with the memory the model needs
there (Serving.fit_beside). Otherwise the group restarts in place: it drains,
its engine starts afresh and is proven before it admits again; a model with
no other group serving goes dark meanwhile (clients get no_healthy_replica
with Retry-After), and the result says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from letsinfer.authority.install import InstallRequest, memory_refusal
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.fit.shape import ShapeError, read_shape
from letsinfer.lifecycle.rollout import free_gpus, swap_beside
from letsinfer.lifecycle.serving import Serving
from letsinfer.store import AuthorityStore, PlacementGroupRecord

log = logging.getLogger("letsinfer.lifecycle")


@dataclass
class Restarted:
    group: str
    node: str
    ready: bool
    how: str  # what happened, for people
    now: str | None = None  # the group serving afterwards, when a new one does
    dark: str | None = None  # why its model had nothing serving during the restart

    def to_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "node": self.node,
            "now": self.now or self.group,
            "ready": self.ready,
            "outcome": self.how,
            "dark": self.dark,
        }


def memory_check(
    store: AuthorityStore, model_store: Path, context: int, slots: int
) -> Callable[[PlacementGroupRecord, tuple[str, ...]], str | None]:
    """Serving.fit_beside on a main: whether a second engine of a group fits on
    these GPUs of its node (none: in its RAM), by the memory fit of `model
    install`. The running engine's own memory is already gone from the node's
    free figures. A model whose shape cannot be read is not judged (as there)."""

    def refusal(pg: PlacementGroupRecord, gpus: tuple[str, ...]) -> str | None:
        svc = store.get_service(pg.service)
        release = store.get_release(pg.release_id)
        node = store.get_node(pg.node_id)
        if svc is None or release is None or node is None or svc.is_external:
            return None
        try:
            shape = read_shape(artifact_path(model_store, svc.artifact_digest))
        except (ShapeError, OSError):
            return None
        req = InstallRequest(pg.service, (), shape=shape, context=context, slots=slots)
        return memory_refusal(req, node, pg.target, release["engine"], gpus)[1]

    return refusal


def room_beside(sv: Serving, pg: PlacementGroupRecord) -> tuple[tuple[str, ...] | None, str]:
    """The GPUs a second engine of ``pg`` would take on its node (() for a cpu
    group), or None and why there is no room."""
    store = sv.store
    if len(store.pg_tasks(pg.id)) > 1:
        return None, "a parallel group restarts as a whole"
    own = store.pg_gpus(pg.id)
    free = free_gpus(store, pg.node_id)
    if len(free) < len(own):
        return None, f"its node has {len(free)} free GPU(s), it holds {len(own)}"
    gpus = tuple(free[: len(own)])
    why = sv.fit_beside(pg, gpus)
    if why is not None:
        return None, f"a second engine {why}"
    return gpus, ""


def _serving_elsewhere(store: AuthorityStore, pg: PlacementGroupRecord) -> bool:
    return any(
        other.id != pg.id and other.desired == "running" and other.state == "ready"
        for other in store.list_placement_groups(service=pg.service)
    )


async def restart_group(sv: Serving, pg: PlacementGroupRecord, node: str) -> Restarted:
    """Start ``pg``'s engine afresh: beside it where there is room, else in place."""
    store = sv.store
    serving = pg.state == "ready"  # a group that serves nothing has nothing to keep serving
    gpus, no_room = room_beside(sv, pg) if serving else (None, "")
    if gpus is not None:
        swap = await swap_beside(sv, pg, pg.release_id, gpus, weights=pg.artifact_digest)
        if swap.started is not None and not swap.started.ready:
            return Restarted(
                pg.id,
                node,
                False,
                f"its fresh engine {swap.new_id}, started beside it, was {swap.started.why()}; "
                f"removed it, {pg.id} serves on as it was",
            )
        if swap.started is not None:
            cut = f" ({swap.cut} request(s) cut after the drain timeout)" if swap.cut else ""
            return Restarted(
                pg.id,
                node,
                True,
                f"ready: started afresh beside it as {swap.new_id} and proven; "
                f"{pg.id} drained and removed{cut}",
                now=swap.new_id,
            )
        no_room = f"its GPUs were taken meanwhile ({swap.why})"
    dark = None
    if serving and not _serving_elsewhere(store, pg):
        dark = f"no spare capacity ({no_room}): {pg.service} goes dark for the restart"
        log.warning("%s on %s: %s", pg.id, node, dark)
    cut = await sv.drain({pg.id})
    try:
        with store.transaction():
            store.unpin_adapters([pg.id])  # afresh with its model's adapters as they are now
            store.restart_groups([pg.id])
        sv.apply()
        came = await sv.started(pg.id)
    finally:
        sv.routing.undrain({pg.id})
    how = f"{came.why()}: restarted in place" + (
        f" ({cut} request(s) cut after the drain timeout)" if cut else ""
    )
    return Restarted(pg.id, node, came.ready, how, dark=dark)
