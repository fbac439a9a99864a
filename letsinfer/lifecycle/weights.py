"""Weights from their origin: ``model update`` moves a model's groups to other
weights (a new commit of the repository it was pulled from, downloaded and
verified by the CLI like ``model pull``), one group at a time exactly as an
upgrade moves them to another release (letsinfer.lifecycle.rollout): each
replacement is proven before the group it replaces leaves. ``model rollback
--weights COMMIT`` moves them back to weights the model ran before.

Every set of weights a model ran is kept with its origin (the authority's
weight history, and the file in the model store), so a rollback never
re-downloads. While a rollout is under way a group names its own weights;
once every group of the model runs the new ones, they become the model's.
A rollout that stops midway leaves the groups it moved on the new weights
and the model's own unchanged (the result says which group is where).

``model update --canary PERCENT`` starts one group on the new weights beside
the others instead (letsinfer.lifecycle.canary): ``model promote`` moves the
rest as an update does, ``model abort`` removes it. Its weights are kept in
the history from the canary's start (event ``canary``), so the promotion
finds them there and a rollback can name them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from letsinfer.contracts.artifacts import artifact_path
from letsinfer.lifecycle import canary, rollout
from letsinfer.lifecycle.serving import Serving
from letsinfer.store import AuthorityStore, ServiceRecord
from letsinfer.store.canaries import CanaryRecord

UPDATE = "model.update"
ROLLBACK = "model.rollback.weights"
WEIGHTS = "weights"  # the kind of canary `model update --canary` starts


@dataclass(frozen=True)
class Weights:
    digest: str  # sha256 of the model file, in the model store
    size: int
    origin: dict[str, Any] | None  # repo, revision, commit, files (as `model pull` records)

    @property
    def commit(self) -> str | None:
        return None if self.origin is None else self.origin.get("commit")

    def said(self) -> str:
        commit = self.commit
        return f"commit {commit}" if commit else f"sha256:{self.digest[:12]}"

    def label(self) -> str:
        """As a canary's change and a rollout's "to" say them."""
        commit = self.commit
        return f"sha256:{self.digest[:12]}" + (f" (commit {commit[:12]})" if commit else "")


def served_model(store: AuthorityStore, name: str) -> ServiceRecord:
    """The model whose weights change (RolloutRefused: none, external, or mid-canary)."""
    svc = store.resolve_service(name)
    if svc is None:
        raise rollout.RolloutRefused(f"no model {name!r}", 404)
    if svc.external:
        raise rollout.RolloutRefused(
            f"model {svc.name} is external (a provider): it has no weights here to change"
        )
    canary = store.get_canary(svc.name)
    if canary is not None:
        raise rollout.RolloutRefused(
            f"model {svc.name} has a canary ({canary.pg_id}, {canary.change}): "
            f"`letsinfer model promote {svc.name}` or `letsinfer model abort {svc.name}` first"
        )
    return svc


def remember_current(store: AuthorityStore, svc: ServiceRecord) -> None:
    """A model added before weights were kept has its current weights recorded
    first, so that an update can be rolled back."""
    if not store.weights_history(svc.name):
        store.add_weights_history(
            svc.name, svc.artifact_digest, svc.artifact_size, svc.origin, "added"
        )


def rollback_target(store: AuthorityStore, model_store: Path, name: str, to: str) -> Weights:
    """Weights ``name`` ran before: ``to`` is their commit (or its first 7+
    characters) or their ``sha256:`` digest (or its start); the newest match."""
    svc = served_model(store, name)
    history = store.weights_history(svc.name)
    wanted = to.removeprefix("sha256:").lower()
    found = [
        w
        for w in history
        if len(wanted) >= 7
        and (
            (to.startswith("sha256:") and w.artifact_digest.startswith(wanted))
            or (not to.startswith("sha256:") and (w.commit or "").lower().startswith(wanted))
        )
    ]
    if not found:
        kept = sorted(
            {w.commit[:12] if w.commit else f"sha256:{w.artifact_digest[:12]}" for w in history}
        )
        raise rollout.RolloutRefused(
            f"model {svc.name} never ran weights {to!r} (at least 7 characters of a commit, "
            f"or sha256:DIGEST); kept: {', '.join(kept) or 'none'}",
            404,
        )
    w = found[-1]
    return Weights(w.artifact_digest, w.artifact_size, w.origin)


async def roll(
    sv: Serving,
    model_store: Path,
    name: str,
    weights: Weights,
    *,
    action: str,
    event: str,
    nodes: list[str],
    vet: rollout.Vet | None,
    actor: str,
    role: str | None,
) -> dict[str, Any]:
    """Every group of the model (on ``nodes``, when given) onto ``weights``,
    one at a time; ``vet`` judges the first replacement before any group leaves."""
    store = sv.store
    svc = served_model(store, name)
    _check_stored(model_store, weights)
    if not nodes and not store.list_placement_groups(service=svc.name):
        return _switch_unloaded(store, svc, weights, action, event, vet, actor, role)
    groups = rollout.groups_on(store, svc.name, nodes)
    remember_current(store, svc)
    changes = [rollout.Change(pg, pg.release_id, weights=weights.digest) for pg in groups]
    result = await rollout.run(
        sv, svc.name, action, event, changes, actor=actor, role=role, vet=vet
    )
    _settle(sv, svc, weights, result, event)
    return _answer(store, svc, weights, result)


def _settle(
    sv: Serving, svc: ServiceRecord, weights: Weights, result: rollout.RolloutResult, event: str
) -> None:
    """After groups moved to ``weights``: the history keeps them, and once
    every group of the model runs them they become the model's."""
    store = sv.store
    moved = any(g.outcome == rollout.UPGRADED for g in result.groups)
    everyone = all(
        rollout.weights_of(store, pg) == weights.digest
        for pg in store.list_placement_groups(service=svc.name)
    )
    with store.transaction():
        last = store.weights_history(svc.name)[-1]
        if moved and last.artifact_digest != weights.digest:
            store.add_weights_history(svc.name, weights.digest, weights.size, weights.origin, event)
        if result.ok and everyone and svc.artifact_digest != weights.digest:
            store.set_service_weights(svc.name, weights.digest, weights.size, weights.origin)
    sv.apply()


def _answer(
    store: AuthorityStore, svc: ServiceRecord, weights: Weights, result: rollout.RolloutResult
) -> dict[str, Any]:
    now = store.get_service(svc.name)
    assert now is not None
    answer = result.to_json()
    answer["weights"] = {
        "sha256": weights.digest,
        "commit": weights.commit,
        "model_runs_them": now.artifact_digest == weights.digest,
    }
    return answer


def _check_stored(model_store: Path, weights: Weights) -> None:
    if not artifact_path(model_store, weights.digest).is_file():
        raise rollout.RolloutRefused(
            f"the model store has no file sha256:{weights.digest[:12]} "
            f"(for {weights.said()}); nothing to roll out"
        )


async def start_canary(
    sv: Serving,
    model_store: Path,
    name: str,
    weights: Weights,
    percent: float,
    *,
    nodes: list[str],
    vet: rollout.Vet | None,
    actor: str,
    role: str | None,
) -> dict[str, Any]:
    """``model update NAME --canary PERCENT``: one new group on ``weights``
    beside the first group (on ``nodes``, when given) that has room beside
    it; proven (and, with ``vet``, judged while it takes no client's request)
    before it takes its share. The model's other groups and its own weights
    do not change until ``model promote``."""
    store = sv.store
    svc = served_model(store, name)  # (refuses a second canary)
    canary.check_percent(percent)
    _check_stored(model_store, weights)
    pg, gpus = canary.choose_beside(
        sv,
        svc.name,
        rollout.groups_on(store, svc.name, nodes),
        None,
        lambda pg: rollout.weights_of(store, pg) == weights.digest,
        weights.said(),
    )
    node = rollout.node_name(store, pg.node_id)
    from_label = f"sha256:{rollout.weights_of(store, pg)[:12]}"
    new_id = canary.add_beside(store, pg, pg.release_id, gpus, weights=weights.digest)
    opened = await canary.open_canary(
        sv,
        svc.name,
        new_id,
        percent,
        kind=WEIGHTS,
        change=weights.label(),
        replaces=pg.id,
        actor=actor,
        role=role,
        vet=vet,
    )
    if opened.ok:  # kept for the promotion, and for a rollback to them
        with store.transaction():
            remember_current(store, svc)
            last = store.weights_history(svc.name)[-1]
            if last.artifact_digest != weights.digest:
                store.add_weights_history(
                    svc.name, weights.digest, weights.size, weights.origin, "canary"
                )
    out = canary.opened_outcome(
        opened, svc.name, pg, node, new_id, from_label, f"sha256:{weights.digest[:12]}", percent
    )
    result = rollout.RolloutResult(svc.name, "model.canary.start", [out])
    return _answer(store, svc, weights, result)


async def _promote_weights(
    sv: Serving, record: CanaryRecord, actor: str, role: str | None
) -> rollout.RolloutResult:
    """The group the canary stands in for drains and goes; every other group
    of the model moves to the canary's weights one at a time (model update);
    once all run them they are the model's."""
    store, model = sv.store, record.service
    group = store.get_placement_group(record.pg_id)
    assert group is not None and group.artifact_digest is not None
    kept = [w for w in store.weights_history(model) if w.artifact_digest == group.artifact_digest]
    assert kept, "a weights canary's weights are kept from its start"
    weights = Weights(kept[-1].artifact_digest, kept[-1].artifact_size, kept[-1].origin)
    new, first = await canary.retire_replaced(sv, record, "updated")
    changes = [
        rollout.Change(pg, pg.release_id, weights=weights.digest)
        for pg in store.list_placement_groups(service=model)
        if pg.id != new.id
    ]
    result = await rollout.run(
        sv, model, "model.promote", "updated", changes, actor=actor, role=role, skipped=[first]
    )
    svc = store.get_service(model)
    assert svc is not None
    _settle(sv, svc, weights, result, "updated")
    return result


canary.register_promoter(WEIGHTS, _promote_weights)


def _switch_unloaded(
    store: AuthorityStore,
    svc: ServiceRecord,
    weights: Weights,
    action: str,
    event: str,
    vet: rollout.Vet | None,
    actor: str,
    role: str | None,
) -> dict[str, Any]:
    """A model with no group now (loaded on demand, or never placed): nothing
    serves to replace, so its next group simply loads the new weights; with a
    gate there is nothing to judge them on, so that is refused."""
    if vet is not None:
        raise rollout.RolloutRefused(
            f"model {svc.name} has no placement group to judge its new weights on "
            "(a gate needs one: load it, e.g. with a request, and run this again)"
        )
    with store.transaction():
        remember_current(store, svc)
        if svc.artifact_digest != weights.digest:
            store.add_weights_history(svc.name, weights.digest, weights.size, weights.origin, event)
            store.set_service_weights(svc.name, weights.digest, weights.size, weights.origin)
        store.append_audit(
            actor,
            action,
            "ok",
            role=role,
            target=svc.name,
            detail=f"no group loaded: its next one runs sha256:{weights.digest[:12]}",
        )
    return {
        "model": svc.name,
        "action": action,
        "ok": True,
        "placement_groups": [],
        "weights": {"sha256": weights.digest, "commit": weights.commit, "model_runs_them": True},
    }
