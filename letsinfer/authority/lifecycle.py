"""Lifecycle changes a person asks for: start or stop a model's placement
groups (starting unparks), remove a model, stop or start the whole cluster,
pause or resume a node's admission. One place for each rule and its audit
record, whoever asks (the CLI, the admin socket, a controller, a child).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from letsinfer.authority.apikeys import KeysNaming, keys_naming
from letsinfer.authority.refusals import audited
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.store import AdapterRecord, AuthorityStore, NodeRecord, StoreError

# Observed states of a group whose engine will not come back by itself.
NOT_RESTARTING = ("parked", "failed")


class NotFound(StoreError):
    """No such model or node; nothing changed."""


class Refused(StoreError):
    """The change is not allowed now; nothing changed."""


@dataclass(frozen=True)
class DesiredSet:
    model: str
    desired: str
    placement_groups: int
    unparked: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "desired": self.desired,
            "placement_groups": self.placement_groups,
            "unparked": self.unparked,
        }


def unpark(store: AuthorityStore, service: str) -> list[str]:
    """Start afresh the groups of ``service`` whose engine is parked (or was
    refused): a new generation, so their agents try again. Inside the caller's
    transaction."""
    stuck = [
        pg.id for pg in store.list_placement_groups(service=service) if pg.state in NOT_RESTARTING
    ]
    store.restart_groups(stuck)
    for pg_id in stuck:
        store.record_pg_observation(pg_id, state="starting", detail="unparked: starting afresh")
    return stuck


def set_model_desired(
    store: AuthorityStore, name: str, desired: str, *, actor: str, role: str | None = None
) -> DesiredSet:
    """``model start`` (running; also unparks) or ``model stop`` (stopped), by
    name or alias."""
    svc = store.resolve_service(name)
    if svc is None:
        raise NotFound(f"no model {name!r}")
    if desired == "running" and cluster_state(store).stopped:
        raise Refused("the cluster is stopped: `letsinfer cluster start` starts what it stopped")
    with store.transaction():
        if svc.is_external:  # no groups: the gateway publishes it, or not
            n = store.set_external_desired(svc.name, desired)
            unparked = []
        else:
            n = store.set_service_desired(svc.name, desired)
            unparked = unpark(store, svc.name) if desired == "running" else []
        action = "model.start" if desired == "running" else "model.stop"
        detail = f"unparked {', '.join(unparked)}" if unparked else None
        store.append_audit(actor, action, "ok", role=role, target=svc.name, detail=detail)
    return DesiredSet(svc.name, desired, n, unparked)


@dataclass(frozen=True)
class RemovedModel:
    model: str
    placement_groups: list[str]
    freed: str | None  # the model store file deleted, if nothing else used it
    shared: list[str]  # other models using the same file (it stays)
    adapters: list[str]  # its LoRA adapters, removed with it (they only fit it)
    fallbacks_cleared: list[str]  # the models and adapters that fell back to it
    keys_narrowed: list[str]  # API keys whose model lists named it (or its adapters)

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "placement_groups": self.placement_groups,
            "freed": self.freed,
            "shared": self.shared,
            "adapters": self.adapters,
            "fallbacks_cleared": self.fallbacks_cleared,
            "keys_narrowed": self.keys_narrowed,
        }


def running_groups(store: AuthorityStore, service: str) -> list[str]:
    return [pg.id for pg in store.list_placement_groups(service=service) if pg.desired == "running"]


def refuse_stranding_keys(
    store: AuthorityStore, name: str, *, actor: str, role: str | None = None
) -> None:
    """Refuse (audited) to remove model ``name`` while an API key may use only
    it or its adapters: checked before anything drains or stops."""
    svc = store.resolve_service(name)
    if svc is None:
        return
    with audited(store, actor, "model.remove", svc.name, role=role):
        _keys_left(store, svc.name, store.list_adapters(svc.name))


def _keys_left(store: AuthorityStore, model: str, adapters: list[AdapterRecord]) -> KeysNaming:
    """What removing ``model`` and ``adapters`` does to API keys; Refused
    while a key may use nothing else."""
    keys = keys_naming(store, {model, *(a.name for a in adapters)})
    if keys.stranded:
        going = f"model {model}" + (" and its LoRA adapters" if adapters else "")
        raise Refused(keys.refusal(going))
    return keys


def remove_model(
    store: AuthorityStore,
    model_store: Path,
    name: str,
    *,
    stop: bool,
    actor: str,
    role: str | None = None,
) -> RemovedModel:
    """``model remove``: refused while a group should run, unless ``stop``; then
    the model, its groups and its release history go in one transaction, and its
    file in the model store when no other model uses those bytes."""
    svc = store.resolve_service(name)
    if svc is None:
        raise NotFound(f"no model {name!r}")
    adapters = store.list_adapters(svc.name)  # removed with it (they only fit it)
    going = {svc.name, *(a.name for a in adapters)}
    running = running_groups(store, svc.name)
    if running and not stop:
        why = (
            f"model {svc.name} has {len(running)} placement group(s) that should run "
            f"({', '.join(running)}); stop it first (`letsinfer model stop {svc.name}`) "
            "or pass --stop"
        )
        store.append_audit(actor, "model.remove", "denied", role=role, target=svc.name, detail=why)
        raise Refused(why)
    groups = [pg.id for pg in store.list_placement_groups(service=svc.name)]
    cleared = [  # those that fell back to it or its adapters (the store clears them)
        other.name
        for other in (*store.list_services(), *store.list_adapters())
        if other.fallback in going and other.name not in going
    ]
    # The keys as of the transaction (a key made meanwhile too); a refusal is
    # audited once the transaction has rolled back.
    with audited(store, actor, "model.remove", svc.name, role=role), store.transaction():
        keys = _keys_left(store, svc.name, adapters)
        store.delete_service(svc.name)
        keys.apply(store)
        shared = [] if svc.is_external else store.services_using(svc.artifact_digest)
        what = (
            f"external {svc.source}"
            if svc.is_external
            else f"sha256:{svc.artifact_digest} "
            + (f"kept (used by {', '.join(shared)})" if shared else "freed")
        )
        store.append_audit(
            actor,
            "model.remove",
            "ok",
            role=role,
            target=svc.name,
            detail=f"placement groups removed: {', '.join(groups) or 'none'}; {what}"
            + (
                f"; LoRA adapters removed: {', '.join(a.name for a in adapters)}"
                if adapters
                else ""
            )
            + (f"; fallback of {', '.join(cleared)} cleared" if cleared else "")
            + (
                f"; dropped from the model lists of API keys {', '.join(keys.narrowed)}"
                if keys.narrowed
                else ""
            ),
        )
    freed = None
    if not shared and not svc.is_external:
        path = artifact_path(model_store, svc.artifact_digest)
        if path.is_file():
            path.unlink()
            freed = str(path)
    for a in adapters:
        if not store.services_using(a.artifact_digest):
            artifact_path(model_store, a.artifact_digest).unlink(missing_ok=True)
    return RemovedModel(
        svc.name, groups, freed, shared, [a.name for a in adapters], cleared, list(keys.narrowed)
    )


# -- the whole cluster --------------------------------------------------------


@dataclass(frozen=True)
class ClusterState:
    stopped: bool
    stopped_at: float | None
    groups: list[str]  # when stopped: the groups `cluster start` restores

    def to_json(self) -> dict[str, object]:
        return {"stopped": self.stopped, "stopped_at": self.stopped_at, "groups": self.groups}


def cluster_state(store: AuthorityStore) -> ClusterState:
    record = store.cluster_stop()
    if record is None:
        return ClusterState(False, None, [])
    return ClusterState(True, float(record["at"]), list(record["groups"]))


def begin_cluster_stop(
    store: AuthorityStore, *, actor: str, role: str | None = None
) -> ClusterState:
    """The gateway refuses new requests (``system_stopped``) from here on; every
    group that should run is remembered for ``start``. The groups stop with
    :func:`complete_cluster_stop` (a running node lets requests in flight
    finish in between)."""
    if cluster_state(store).stopped:
        raise Refused("the cluster is already stopped (`letsinfer cluster start` starts it)")
    running = [pg.id for pg in store.list_placement_groups() if pg.desired == "running"]
    now = time.time()
    with store.transaction():
        store.set_cluster_stop({"at": now, "groups": running})
        store.append_audit(
            actor,
            "cluster.stop",
            "ok",
            role=role,
            detail=f"stopping {', '.join(running) or 'no placement group'}",
        )
    return ClusterState(True, now, running)


def complete_cluster_stop(store: AuthorityStore, state: ClusterState) -> None:
    store.set_groups_desired(state.groups, "stopped")


def start_cluster(store: AuthorityStore, *, actor: str, role: str | None = None) -> list[str]:
    """Exactly the groups ``stop`` stopped (those that still exist) run again."""
    state = cluster_state(store)
    if not state.stopped:
        raise Refused("the cluster is not stopped")
    existing = {pg.id for pg in store.list_placement_groups()}
    groups = [g for g in state.groups if g in existing]
    with store.transaction():
        store.set_groups_desired(groups, "running")
        for pg_id in groups:  # what was seen before the stop says nothing now
            store.record_pg_observation(pg_id, state="pending", detail="cluster start")
        store.set_cluster_stop(None)
        store.append_audit(
            actor,
            "cluster.start",
            "ok",
            role=role,
            detail=f"started {', '.join(groups) or 'no placement group'}",
        )
    return groups


def set_node_paused(
    store: AuthorityStore, node: NodeRecord, paused: bool, *, actor: str, role: str | None = None
) -> None:
    """``node pause`` / ``node resume``: admission only; engines keep running."""
    with store.transaction():
        store.set_node_paused(node.id, paused)
        action = "node.pause" if paused else "node.resume"
        store.append_audit(actor, action, "ok", role=role, target=node.name)


def find_node(store: AuthorityStore, name: str) -> NodeRecord:
    node = store.find_node(name)
    if node is None:
        raise NotFound(f"no node {name!r} (see `letsinfer node list`)")
    return node
