"""Lifecycle changes a person asks for: start or stop a model's placement
groups, pause or resume a node's admission. One place for each rule and its
audit record, whoever asks (the CLI, the admin socket, a controller, a child).
"""

from __future__ import annotations

from dataclasses import dataclass

from letsinfer.store import AuthorityStore, NodeRecord, StoreError


class NotFound(StoreError):
    """No such model or node; nothing changed."""


@dataclass(frozen=True)
class DesiredSet:
    model: str
    desired: str
    placement_groups: int

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "desired": self.desired,
            "placement_groups": self.placement_groups,
        }


def set_model_desired(
    store: AuthorityStore, name: str, desired: str, *, actor: str, role: str | None = None
) -> DesiredSet:
    """``model start`` (running) or ``model stop`` (stopped), by name or alias."""
    svc = store.resolve_service(name)
    if svc is None:
        raise NotFound(f"no model {name!r}")
    with store.transaction():
        n = store.set_service_desired(svc.name, desired)
        action = "model.start" if desired == "running" else "model.stop"
        store.append_audit(actor, action, "ok", role=role, target=svc.name)
    return DesiredSet(svc.name, desired, n)


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
