"""Canaries: one new placement group of a model takes a share of its requests
beside the groups it would replace, until an operator promotes it (the rest
of the model follows, as a normal upgrade) or aborts it (the group goes and
every request returns to the others).

The canary is stored (``canaries``), so the split outlives a restart of the
main; the gateway takes it from its directory snapshot and draws one random
number per request of that model only (letsinfer.gateway.routing). Which
group answered each request is in the request records already: ``model
canary`` compares both sides from them and from eval runs pinned to a group.

``model upgrade --canary`` starts one (:func:`start_release_canary`); ``model
update --canary`` (letsinfer.lifecycle.weights) makes its group with
:func:`choose_beside` and :func:`add_beside`, starts it with :func:`open_canary`
and registers how its promotion goes with :func:`register_promoter`.

With a gate (letsinfer.evals.gate) the new group starts held out of clients'
traffic, is judged, and only takes its share once it has passed; one that
fails is removed. ``model promote`` with a gate judges the canary's group
first and, below the score, refuses: the canary stays as it was.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from letsinfer.lifecycle import rollout
from letsinfer.lifecycle.rollout import (
    GATED,
    GroupOutcome,
    RolloutRefused,
    RolloutResult,
    Verdict,
    Vet,
)
from letsinfer.lifecycle.serving import Serving, Started
from letsinfer.store import AuthorityStore, PlacementGroupRecord, StoreError
from letsinfer.store.canaries import CanaryRecord
from letsinfer.store.requests import RequestStore

log = logging.getLogger("letsinfer.lifecycle")

RELEASE = "release"  # the kind `model upgrade --canary` starts

# Outcomes beside rollout's: the group started as a canary; the canary removed.
CANARY = "canary"
ABORTED = "aborted"

Promoter = Callable[[Serving, CanaryRecord, str, str | None], Awaitable[RolloutResult]]
_PROMOTERS: dict[str, Promoter] = {}


def register_promoter(kind: str, promoter: Promoter) -> None:
    """How ``model promote`` finishes a canary of this kind: it is called with
    the canary still stored and does the rest (the release kind: the model's
    other groups move to its release)."""
    _PROMOTERS[kind] = promoter


def check_percent(percent: float) -> None:
    if not (math.isfinite(percent) and 0 < percent < 100):
        raise RolloutRefused(
            f"--canary takes the share of requests in percent, above 0 and below 100 "
            f"(not {percent:g})",
            400,
        )


def _model(store: AuthorityStore, name: str) -> str:
    svc = store.resolve_service(name)
    if svc is None:
        raise RolloutRefused(f"no model {name!r}", 404)
    return svc.name


def refuse_if_open(store: AuthorityStore, model: str) -> None:
    """One canary per model: call before making the new group."""
    canary = store.get_canary(model)
    if canary is not None:
        raise RolloutRefused(
            f"model {model} has a canary already ({canary.pg_id}, {canary.change}, "
            f"{canary.percent:g}%): `letsinfer model promote {model}` or "
            f"`letsinfer model abort {model}` first"
        )


def open_canary_of(store: AuthorityStore, name: str) -> CanaryRecord:
    model = _model(store, name)
    canary = store.get_canary(model)
    if canary is None:
        raise RolloutRefused(f"model {model} has no canary", 404)
    return canary


def _audit(
    store: AuthorityStore,
    actor: str,
    action: str,
    outcome: str,
    role: str | None,
    model: str,
    detail: str,
) -> None:
    store.append_audit(actor, action, outcome, role=role, target=model, detail=detail[:2000])


@dataclass(frozen=True)
class Opened:
    """How a canary's start went: its group's start, and the gate's verdict
    when one judged it (the canary stands only when both went well)."""

    started: Started
    verdict: Verdict | None = None

    @property
    def ok(self) -> bool:
        return self.started.ready and (self.verdict is None or self.verdict.passed)

    def why(self) -> str:
        """Why it does not stand, for people."""
        if not self.started.ready:
            return f"was {self.started.why()}"
        assert self.verdict is not None
        return f"failed the gate ({self.verdict.said})"


def choose_beside(
    sv: Serving,
    model: str,
    groups: list[PlacementGroupRecord],
    release_id: str | None,
    runs_it: Callable[[PlacementGroupRecord], bool],
    what: str,
) -> tuple[PlacementGroupRecord, tuple[str, ...]]:
    """The first of ``groups`` a canary can stand beside, and the free GPUs
    of its node for it: it can take ``release_id`` (None: its own), does not
    run the change already (``runs_it``; ``what`` names the change), runs,
    and has room for a group as large beside it."""
    store = sv.store
    reasons = []
    for pg in groups:
        why = rollout.cannot_take(store, pg, release_id or pg.release_id) or sv.unreachable(
            pg.node_id
        )
        if why is None and runs_it(pg):
            why = f"it runs {what} already"
        if why is None and pg.desired != "running":
            why = "it is stopped"
        own = store.pg_gpus(pg.id)
        free = rollout.free_gpus(store, pg.node_id)
        if why is None and len(free) < len(own):
            why = f"no {len(own)} free GPU(s) on its node for a group beside it"
        if why is None:
            return pg, tuple(free[: len(own)])
        reasons.append(f"{pg.id}: {why}")
    raise RolloutRefused(
        f"no group of {model} can have a canary beside it ({'; '.join(reasons) or 'it has none'})"
    )


def add_beside(
    store: AuthorityStore,
    pg: PlacementGroupRecord,
    release_id: str,
    gpus: tuple[str, ...],
    *,
    weights: str | None = None,
) -> str:
    """Record a new group of ``pg``'s model beside it (no release history yet:
    it is written once the canary is promoted), running ``weights`` (a model
    file's sha256) when given; its id."""
    new_id = f"pg-{uuid.uuid4().hex[:12]}"
    try:
        with store.transaction():
            store.add_placement_group(
                new_id, pg.service, pg.node_id, release_id, pg.target, gpus, event=None
            )
            if weights is not None:
                store.set_pg_weights(new_id, weights)
    except StoreError as exc:  # e.g. its GPUs were taken meanwhile
        raise RolloutRefused(f"no room for a canary beside {pg.id}: {exc}") from exc
    return new_id


async def open_canary(
    sv: Serving,
    model: str,
    pg_id: str,
    percent: float,
    *,
    kind: str,
    change: str,
    replaces: str | None,
    actor: str,
    role: str | None,
    vet: Vet | None = None,
) -> Opened:
    """Give ``pg_id``, a new group of ``model`` (recorded, its engine not
    necessarily started), ``percent`` of the model's requests from the moment
    it is ready (healthy and proven by its agent) and, with ``vet`` (a gate),
    has passed it: until then it is held out of clients' traffic. A group
    that does not become ready, or fails the gate, is removed, and the canary
    with it. Audited (``model.canary.start``; the gate: ``model.gate``).
    ``change`` says what it runs differently, for people; ``replaces``: the
    group it stands in for once promoted.

    Call it inside ``sv.exclusive`` (as every lifecycle operation runs) after
    :func:`refuse_if_open` and after making the group (with ``event=None``):
    the caller records the group's release history once it is promoted."""
    store = sv.store
    check_percent(percent)
    refuse_if_open(store, model)
    record = CanaryRecord(model, pg_id, percent, kind, change, replaces, time.time(), actor)
    verdict = None
    if vet is None:
        with store.transaction():
            store.add_canary(record)
    else:  # judged first: a plain group of the model no client reaches
        sv.routing.hold({pg_id})
    try:
        sv.apply()
        started = await sv.started(pg_id)
        if started.ready and vet is not None:
            verdict = await vet(pg_id)
            if verdict.passed:
                with store.transaction():
                    store.add_canary(record)
                sv.apply()  # (its share is published before it is let go)
        opened = Opened(started, verdict)
        if not opened.ok:
            store.delete_placement_group(pg_id)  # (the canary goes with it)
            sv.apply()
            sv.routing.forget(model, pg_id)
    finally:
        if vet is not None:
            sv.routing.unhold({pg_id})
    if not opened.ok:
        _audit(
            store, actor, "model.canary.start", "failed", role, model,
            f"{pg_id} ({change}) {opened.why()}; removed it",
        )  # fmt: skip
        return opened
    _audit(
        store, actor, "model.canary.start", "ok", role, model,
        f"{pg_id} ({change}) takes {percent:g}% of requests"
        + (f" beside {replaces}" if replaces else "")
        + (f", passed the gate ({verdict.said})" if verdict is not None else ""),
    )  # fmt: skip
    log.info("canary of %s: %s (%s) takes %g%%", model, pg_id, change, percent)
    return opened


def opened_outcome(
    opened: Opened,
    model: str,
    pg: PlacementGroupRecord,
    node: str,
    new_id: str,
    from_label: str,
    to_label: str,
    percent: float,
) -> GroupOutcome:
    """What ``model upgrade|update --canary`` says about the group it stands beside."""
    out = GroupOutcome(pg.id, node, from_label, to_label, CANARY, now=new_id, gate=opened.verdict)
    if opened.ok:
        passed = f", passed the gate ({opened.verdict.said})" if opened.verdict else ""
        out.detail = (
            f"{new_id} started beside it and proven{passed}; it takes {percent:g}% of "
            f"{model}'s requests until `letsinfer model promote {model}` or "
            f"`letsinfer model abort {model}`"
        )
        return out
    out.outcome = rollout.RESTORED if not opened.started.ready else GATED
    out.now = None
    out.detail = (
        f"its canary {new_id} on {to_label} {opened.why()}; removed it, "
        f"{pg.id} kept serving {from_label}"
    )
    return out


async def start_release_canary(
    sv: Serving,
    name: str,
    release_id: str,
    percent: float,
    nodes: list[str],
    *,
    actor: str,
    role: str | None,
    vet: Vet | None = None,
) -> RolloutResult:
    """``model upgrade NAME --release R --canary PERCENT``: one new group on
    ``release_id`` beside the first group (on ``nodes``, when given) that can
    take it and has room beside it; proven (and, with ``vet``, judged) before
    it takes any request."""
    store = sv.store
    check_percent(percent)
    model, changes = rollout.upgrade_changes(sv, name, release_id, nodes)  # (none open)
    pg, gpus = choose_beside(
        sv,
        model,
        [c.group for c in changes],
        release_id,
        lambda pg: pg.release_id == release_id,
        release_id,
    )
    node = rollout.node_name(store, pg.node_id)
    new_id = add_beside(store, pg, release_id, gpus)
    opened = await open_canary(
        sv,
        model,
        new_id,
        percent,
        kind=RELEASE,
        change=release_id,
        replaces=pg.id,
        actor=actor,
        role=role,
        vet=vet,
    )
    out = opened_outcome(opened, model, pg, node, new_id, pg.release_id, release_id, percent)
    return RolloutResult(model, "model.canary.start", [out])


async def promote(
    sv: Serving, name: str, *, actor: str, role: str | None, vet: Vet | None = None
) -> RolloutResult:
    """``model promote NAME``: the canary stays; its kind says what follows.
    With ``vet`` (the model's gate) its group is judged first; below the
    score nothing changes and the result says so (not ok)."""
    canary = open_canary_of(sv.store, name)
    promoter = _PROMOTERS.get(canary.kind)
    if promoter is None:
        raise RolloutRefused(f"this main cannot promote a canary of kind {canary.kind!r}")
    if vet is not None:
        verdict = await vet(canary.pg_id)
        if not verdict.passed:
            return _refused_promotion(sv.store, canary, verdict, actor, role)
    return await promoter(sv, canary, actor, role)


def _refused_promotion(
    store: AuthorityStore, canary: CanaryRecord, verdict: Verdict, actor: str, role: str | None
) -> RolloutResult:
    model = canary.service
    pg = store.get_placement_group(canary.pg_id)
    assert pg is not None  # (the canary goes with its group)
    out = GroupOutcome(
        pg.id,
        rollout.node_name(store, pg.node_id),
        canary.change,
        canary.change,
        GATED,
        gate=verdict,
    )
    out.detail = (
        f"the canary failed the gate ({verdict.said}); not promoted: it keeps its "
        f"{canary.percent:g}% (`letsinfer model abort {model}` removes it)"
    )
    _audit(store, actor, "model.promote", "failed", role, model, f"{pg.id}: {out.detail}")
    return RolloutResult(model, "model.promote", [out])


async def retire_replaced(
    sv: Serving, canary: CanaryRecord, event: str
) -> tuple[PlacementGroupRecord, GroupOutcome]:
    """The first step of every promotion: the group the canary stands in for
    drains and goes, the canary ends, and its group's release history starts
    (``event``). The canary's group and how the replaced one went."""
    store, model = sv.store, canary.service
    new = store.get_placement_group(canary.pg_id)
    assert new is not None  # (the canary goes with its group)
    old = store.get_placement_group(canary.replaces) if canary.replaces else None
    first = GroupOutcome(
        old.id if old else new.id,
        rollout.node_name(store, new.node_id),
        old.release_id if old else canary.change,
        canary.change,
        rollout.UPGRADED,
        now=new.id,
    )
    left = await sv.drain({old.id}) if old is not None else 0
    with store.transaction():
        if old is not None:
            store.delete_placement_group(old.id)
        store.delete_canary(model)
        store.add_release_history(model, new.node_id, new.id, new.release_id, event)
    sv.apply()
    if old is not None:
        sv.routing.undrain({old.id})
        sv.routing.forget(model, old.id)
        first.detail = f"its canary {new.id} promoted; {old.id} drained and removed" + (
            f" ({left} request(s) still in flight after the drain timeout were cut)" if left else ""
        )
    else:
        first.detail = "the canary promoted"
    return new, first


async def _promote_release(
    sv: Serving, canary: CanaryRecord, actor: str, role: str | None
) -> RolloutResult:
    """The group the canary stands in for drains and goes; every other group
    of the model moves to the canary's release one at a time (model upgrade)."""
    store, model = sv.store, canary.service
    rollout.check_release(sv, canary.change)
    new, first = await retire_replaced(sv, canary, "upgraded")
    changes = [
        rollout.Change(pg, canary.change)
        for pg in store.list_placement_groups(service=model)
        if pg.id != new.id
    ]
    return await rollout.run(
        sv, model, "model.promote", "upgraded", changes, actor=actor, role=role, skipped=[first]
    )


register_promoter(RELEASE, _promote_release)


async def abort(sv: Serving, name: str, *, actor: str, role: str | None) -> RolloutResult:
    """``model abort NAME``: the canary's group drains (from this moment every
    new request goes to the others) and is removed."""
    store = sv.store
    canary = open_canary_of(store, name)
    model = canary.service
    pg = store.get_placement_group(canary.pg_id)
    assert pg is not None
    node = rollout.node_name(store, pg.node_id)
    back = store.get_placement_group(canary.replaces) if canary.replaces else None
    left = await sv.drain({pg.id})
    store.delete_placement_group(pg.id)  # (the canary goes with it)
    sv.apply()
    sv.routing.undrain({pg.id})
    sv.routing.forget(model, pg.id)
    out = GroupOutcome(
        pg.id, node, canary.change, back.release_id if back else "-", ABORTED, now=pg.id
    )
    out.detail = "drained and removed; every request goes to the model's other groups" + (
        f" ({left} request(s) still in flight after the drain timeout were cut)" if left else ""
    )
    _audit(
        store,
        actor,
        "model.canary.abort",
        "ok",
        role,
        model,
        f"{pg.id} ({canary.change}): {out.detail}",
    )
    return RolloutResult(model, "model.abort", [out])


# -- how both sides compare ------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def report(store: AuthorityStore, records: Path | None, name: str) -> dict[str, Any]:
    """``model canary NAME``: per side (the canary's group, the model's others)
    since the canary started: requests answered, errors (status 400 and
    above), latency percentiles, and the latest eval run pinned to one of the
    side's groups. ``records``: the main's request records file (None or
    missing: no requests counted yet)."""
    canary = open_canary_of(store, name)
    model = canary.service
    stable = [pg.id for pg in store.list_placement_groups(service=model) if pg.id != canary.pg_id]
    sides = {"canary": [canary.pg_id], "stable": stable}
    counts: dict[str | None, tuple[int, int]] = {}
    durations: dict[str, list[float]] = {side: [] for side in sides}
    if records is not None and records.exists():
        requests = RequestStore(records, readonly=True)
        try:
            counts = requests.group_counts(model, canary.started_at)
            for side, groups in sides.items():
                durations[side] = sorted(requests.group_durations(model, canary.started_at, groups))
        finally:
            requests.close()
    runs = [r for r in store.list_eval_runs(model, limit=500) if r.pg is not None]
    total = sum(counts.get(g, (0, 0))[0] for groups in sides.values() for g in groups)
    answer: dict[str, Any] = {
        "model": model,
        "group": canary.pg_id,
        "percent": canary.percent,
        "kind": canary.kind,
        "change": canary.change,
        "replaces": canary.replaces,
        "started_at": canary.started_at,
        "started_by": canary.started_by,
    }
    for side, groups in sides.items():
        n = sum(counts.get(g, (0, 0))[0] for g in groups)
        errors = sum(counts.get(g, (0, 0))[1] for g in groups)
        latest = next((r for r in runs if r.pg in groups), None)  # (latest first)
        answer[side] = {
            "groups": groups,
            "requests": n,
            "share": round(n / total, 4) if total else None,
            "errors": errors,
            "error_rate": round(errors / n, 4) if n else None,
            "latency_ms": {
                "p50": _percentile(durations[side], 0.50),
                "p95": _percentile(durations[side], 0.95),
            },
            "eval": None
            if latest is None
            else {
                "run": latest.id,
                "suite": latest.suite,
                "group": latest.pg,
                "score": latest.score,
                "passed": latest.passed,
                "at": latest.finished_at,
            },
        }
    return answer
