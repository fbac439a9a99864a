"""Where a load goes: the same planner as `model install` (fit, exclusive
GPUs, fresh facts), over every active node, preferring one that already
holds the model's file; and the changes a load, an unload or an eviction
makes to the authority, each with its audit record.

Runs on the main's gateway loop, off the request path (a load's own task).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from letsinfer.authority.install import InstallRequest, Placement, plan_groups
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.engines.releases import Release
from letsinfer.fit.estimate import estimate
from letsinfer.fit.shape import ModelShape, ShapeError, read_shape
from letsinfer.home import Home
from letsinfer.store import AuthorityStore, NodeRecord

ACTOR = "capacity"


@dataclass(frozen=True)
class PlacingSettings:
    engine: str
    llama_server_binary: str
    context: int
    slots: int
    fresh_within_s: float
    main_id: str


@dataclass(frozen=True)
class Found:
    placement: Placement | None
    skipped: tuple[tuple[str, str], ...]  # (node, why) for every node that cannot take it

    def reasons(self) -> str:
        return "; ".join(f"{node}: {why}" for node, why in self.skipped) or "no active node"


class Placer:
    def __init__(
        self,
        store: AuthorityStore,
        home: Home,
        settings: PlacingSettings,
        sign: Callable[[Release], str],
    ) -> None:
        self.store = store
        self.home = home
        self.settings = settings
        self.sign = sign
        self._shapes: dict[str, ModelShape | None] = {}

    def shape(self, service: str) -> ModelShape | None:
        """The model's shape from its file (memoised by digest): None when unknown."""
        svc = self.store.get_service(service)
        if svc is None or svc.is_external:
            return None
        digest = svc.artifact_digest
        if digest not in self._shapes:
            try:
                self._shapes[digest] = read_shape(artifact_path(self.home.model_store, digest))
            except (ShapeError, OSError):
                self._shapes[digest] = None
        return self._shapes[digest]

    def _request(self, service: str, nodes: tuple[str, ...]) -> InstallRequest:
        s = self.settings
        return InstallRequest(
            service=service,
            nodes=nodes,
            engine=s.engine,
            llama_server_binary=s.llama_server_binary,
            shape=self.shape(service),
            context=s.context,
            slots=s.slots,
        )

    def find(self, service: str) -> Found:
        """A node (and GPUs) for one more group of ``service``: never one that
        runs a group of it already; a child holding its file first, then the main,
        then any other child."""
        nodes = [n for n in self.store.list_nodes() if n.state == "active"]
        found = plan_groups(
            self.store,
            self._request(service, tuple(n.name for n in nodes)),
            self.settings.fresh_within_s,
            self.settings.main_id,
        )
        skipped = list(found.skipped)
        fresh = []
        for p in found.placements:
            if p.replaces:
                skipped.append((p.node.name, f"runs a group of {service} already"))
            else:
                fresh.append(p)
        svc = self.store.get_service(service)
        digest = svc.artifact_digest if svc else ""
        main_id = self.settings.main_id

        def preference(p: Placement) -> int:
            # The main holds every file (it is the children's mirror), so holding
            # it says something only of a child: such a child loads with no copy,
            # and keeps the main's CPU for the gateway; the main next, no copy
            # either; another child last, which must fetch the file first.
            if p.node.id == main_id:
                return 1
            return 0 if digest in (p.node.facts or {}).get("artifacts", []) else 2

        fresh.sort(key=preference)
        return Found(fresh[0] if fresh else None, tuple(skipped))

    def never_fits(self, service: str) -> str | None:
        """Why no node could hold the model even with nothing else on it (its
        memory need against each node's whole RAM or GPU memory); None when
        one could, or when the model's shape is unknown."""
        shape = self.shape(service)
        nodes = [n for n in self.store.list_nodes() if n.state == "active"]
        if shape is None or not nodes:
            return None if nodes else "no active node"
        s = self.settings
        for node in nodes:
            if _could_hold(node, shape, s.engine, s.context, s.slots):
                return None
        need = estimate(shape, s.engine, "cpu", s.context, s.slots)
        return (
            f"needs {need.on(1) / 2**30:.1f} GiB ({need.parts()}); no active node has that "
            "much memory or GPU memory in all"
        )

    def load(self, service: str, placement: Placement, reason: str) -> str:
        """One more group of ``service`` where ``placement`` says; audited."""
        r = placement.release
        with self.store.transaction():
            self.store.ensure_release(
                r.id, r.engine, r.version, r.target, r.artifacts, r.launch, self.sign(r)
            )
            pg = self.store.add_placement_group(
                f"pg-{uuid.uuid4().hex[:12]}",
                service,
                placement.node.id,
                r.id,
                r.target,
                placement.gpus,
            )
            self.store.append_audit(
                ACTOR,
                "model.load",
                "ok",
                target=f"{service}@{placement.node.name}",
                detail=f"{pg.id} {r.id} gpus={','.join(placement.gpus) or '-'}: {reason}",
            )
        return pg.id

    def unload(self, service: str, pg_id: str, action: str, reason: str) -> bool:
        """The group goes (its engine stops on its node); audited as ``action``
        (model.unload, model.evict, model.scale). False: it was gone already."""
        with self.store.transaction():
            if self.store.get_placement_group(pg_id) is None:
                return False
            self.store.delete_placement_group(pg_id)
            self.store.append_audit(
                ACTOR, action, "ok", target=service, detail=f"{pg_id}: {reason}"
            )
        return True

    def refused(self, service: str, reason: str) -> None:
        self.store.append_audit(ACTOR, "model.load", "denied", target=service, detail=reason)


def _could_hold(node: NodeRecord, shape: ModelShape, engine: str, context: int, slots: int) -> bool:
    facts = node.facts or {}
    targets = facts.get("targets", ["cpu"])
    if "cuda" in targets:
        need = estimate(shape, "llama-server", "cuda", context, slots)
        if any(need.on(1) <= int(g.get("memory_total", 0)) for g in facts.get("gpus", [])):
            return True
    if "cpu" not in targets:
        return False
    total = facts.get("memory_bytes")
    return total is None or estimate(shape, engine, "cpu", context, slots).on(1) <= int(total)
