"""Setting a model's scaling policy (`letsinfer model scale`, the ops route):
checked whole before anything is stored, audited either way."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from letsinfer.authority.refusals import audited
from letsinfer.capacity.policy import FIELDS, PolicyError, ScalingPolicy
from letsinfer.store import AuthorityStore, StoreError


def resolve(current: ScalingPolicy, change: dict[str, Any]) -> ScalingPolicy:
    """``current`` with ``change`` (raises PolicyError, saying why, when the
    result cannot be). ``--min`` alone above the current ``--max`` raises
    ``--max`` with it, and ``--max`` alone below ``--min`` lowers ``--min``,
    as an operator means it."""
    unknown = set(change) - set(FIELDS)
    if unknown:
        raise PolicyError(f"unknown scaling setting(s): {', '.join(sorted(unknown))}")
    wanted = dict(change)
    if "min_groups" in wanted and "max_groups" not in wanted:
        wanted["max_groups"] = max(current.max_groups, wanted["min_groups"], 1)
    if "max_groups" in wanted and "min_groups" not in wanted:
        wanted["min_groups"] = min(current.min_groups, wanted["max_groups"])
    return replace(current, **wanted)


def set_policy(
    store: AuthorityStore,
    name: str,
    change: dict[str, Any],
    *,
    actor: str = "cli",
    role: str | None = None,
) -> tuple[str, ScalingPolicy]:
    """Change the fields in ``change`` (the others stay, see :func:`resolve`);
    the model's canonical name and its policy now."""
    with audited(store, actor, "model.scale", None, role=role):
        svc = store.resolve_service(name)
        if svc is None:
            raise StoreError(f"no model {name!r} (see `letsinfer model list`)")
        if svc.is_external:
            raise StoreError(f"model {svc.name} is external: its provider scales it, not letsinfer")
        try:
            policy = resolve(store.scaling_policy(svc.name), change)
        except PolicyError as exc:
            raise StoreError(str(exc)) from exc
    with store.transaction():
        store.set_scaling_policy(svc.name, policy)
        store.append_audit(
            actor, "model.scale", "ok", role=role, target=svc.name, detail=policy.describe()
        )
    return svc.name, policy
