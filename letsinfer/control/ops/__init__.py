"""The admin API: typed operations on a main node, each within a role. The
same routes serve a paired controller (mutual TLS, role from its certificate)
and a local administrator (the admin unix socket, peer credentials). Nothing
runs commands.

Roles: viewer reads state, usage and the audit chain; operator adds
lifecycle (pause, resume, model start/stop/upgrade/rollback/scale);
administrator adds keys, fallbacks, controllers, join codes and the
exposure (and, through the CLI on the main only, people, projects and
settings). docs/admin-api.md lists each operation.
"""

from collections.abc import Awaitable, Callable

from fastapi import APIRouter

from letsinfer.control.ops.adapters import adapters_router
from letsinfer.control.ops.admission import admission_router
from letsinfer.control.ops.audit import audit_router
from letsinfer.control.ops.context import ApplyExposure, OpsContext
from letsinfer.control.ops.controllers import controllers_router
from letsinfer.control.ops.doctor import doctor_router
from letsinfer.control.ops.evals import evals_router
from letsinfer.control.ops.exposure import exposure_router
from letsinfer.control.ops.gates import gates_router
from letsinfer.control.ops.installs import installs_router
from letsinfer.control.ops.keys import KeyCreate, KeyPolicyChange, keys_router
from letsinfer.control.ops.listing import SceneFacts, listing_router
from letsinfer.control.ops.metrics import metrics_router
from letsinfer.control.ops.mirror import mirror_router
from letsinfer.control.ops.models import FallbackChange, ScaleChange, models_router
from letsinfer.control.ops.nodes import OnRemoved, nodes_router
from letsinfer.control.ops.records import records_router
from letsinfer.control.ops.releases import releases_router
from letsinfer.control.ops.roles import actor_of, nothing_to_apply
from letsinfer.control.ops.rollouts import Rollouts, rollouts_router
from letsinfer.control.ops.state import state_router
from letsinfer.control.ops.updates import updates_router
from letsinfer.control.ops.webhooks import webhooks_router
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.store import AuthorityStore

__all__ = [
    "FallbackChange",
    "KeyCreate",
    "KeyPolicyChange",
    "ScaleChange",
    "actor_of",
    "nothing_to_apply",
    "ops_router",
]


def ops_router(
    store: AuthorityStore,
    identity: NodeIdentity,
    on_change: Callable[[], Awaitable[None]] = nothing_to_apply,
    home: Home | None = None,
    rollouts: Rollouts | None = None,
    scene: SceneFacts | None = None,
    on_removed: OnRemoved | None = None,
    apply_exposure: ApplyExposure | None = None,
) -> APIRouter:
    """``on_change`` runs after each mutation: the node applies it at once
    instead of at its next reconcile. ``home``: the main's request records and
    signed audit head. ``rollouts``: upgrade and rollback (the admin socket
    has its own, beside its other rollouts). ``scene``: what only the running
    gateway knows, for the displays (none: the settings' word). ``on_removed``:
    after a node's removal, the running node stops routing to it and tells it
    (none: `node remove` answers 503). ``apply_exposure``: the running node
    serves a changed exposure (none: at its next start)."""
    router = APIRouter()
    ops = OpsContext(store, identity, on_change, home, on_removed, apply_exposure)
    for part in admin_routers(ops, rollouts, scene):
        router.include_router(part)
    return router


def admin_routers(
    ops: OpsContext, rollouts: Rollouts | None, scene: SceneFacts | None = None
) -> list[APIRouter]:
    """The admin API by area, each its own router (the OpenAPI document reads
    each route's role from them)."""
    parts = [
        state_router(ops),
        listing_router(ops, scene),
        metrics_router(ops),
        exposure_router(ops, scene),
        models_router(ops),
        admission_router(ops),
        gates_router(ops),
    ]
    if rollouts is not None:
        parts += [
            rollouts_router(ops, rollouts),
            updates_router(ops, rollouts),
            adapters_router(ops, rollouts),
            installs_router(ops, rollouts),
        ]
    return [
        *parts,
        keys_router(ops),
        controllers_router(ops),
        nodes_router(ops),
        webhooks_router(ops),
        mirror_router(ops),
        releases_router(ops),
        evals_router(ops),
        records_router(ops),
        audit_router(ops),
        doctor_router(ops),
    ]
