"""Changing the release a model's groups run, one group at a time, never by
taking away what serves before its replacement is proven.

Per group: where spare capacity allows (a cpu group, or enough free GPUs on
its node) the replacement is a new group started beside the old one; once it
is ready (healthy and proven by its agent) the old group drains (no new
admission, requests in flight finish) and is removed. Otherwise the group
drains, its engine is replaced on the same GPUs with the new release, and
must be proven before it admits again; if it is not, the exact prior release
(the same signed release record) is restored for that group before the
rollout stops. Groups after a failed one are not tried. The result names
every group and what happened to it.

Used by ``model upgrade``, ``model rollback`` (a release this model ran before,
from the authority's history: never re-resolved) and ``model install
--replace-existing``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from letsinfer.authority.placements import release_of
from letsinfer.engines.releases import is_parallel
from letsinfer.lifecycle.serving import Serving, Started
from letsinfer.release import runtime
from letsinfer.release.signatures import TrustError
from letsinfer.store import (
    AuthorityStore,
    PlacementGroupRecord,
    ReleaseHistoryRecord,
    StoreError,
)

log = logging.getLogger("letsinfer.lifecycle")

# What happened to a group. Only "restored" and "failed" fail a rollout.
UPGRADED = "upgraded"  # now runs the new release (maybe as a new group: `now`)
UNCHANGED = "unchanged"  # already ran it
SKIPPED = "skipped"  # cannot take it (detail says why); untouched
RESTORED = "restored"  # the new release failed; the prior one serves again
FAILED = "failed"  # the new release failed and the prior one did not come back
NOT_TRIED = "not tried"  # after an earlier group failed
GATED = "gated"  # its replacement scored below the gate; removed, the group serves on


class RolloutRefused(Exception):
    """Refused before anything changed; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class GroupOutcome:
    group: str
    node: str
    from_release: str
    to_release: str
    outcome: str
    detail: str | None = None
    now: str | None = None  # the group that serves it afterwards, when a new one does
    gate: Verdict | None = None  # the gate's verdict on its replacement, when one ran

    def to_json(self) -> dict[str, object]:
        shown: dict[str, object] = {
            "group": self.group,
            "node": self.node,
            "from": self.from_release,
            "to": self.to_release,
            "outcome": self.outcome,
            "detail": self.detail,
            "now": self.now or self.group,
        }
        if self.gate is not None:
            shown["gate"] = self.gate.detail
        return shown

    def line(self) -> str:
        moved = f" (now {self.now})" if self.now and self.now != self.group else ""
        said = f": {self.detail}" if self.detail else ""
        return f"{self.group} on {self.node}: {self.outcome}{moved}{said}"


@dataclass
class RolloutResult:
    model: str
    action: str
    groups: list[GroupOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(g.outcome in (RESTORED, FAILED, GATED) for g in self.groups)

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "action": self.action,
            "ok": self.ok,
            "placement_groups": [g.to_json() for g in self.groups],
        }


@dataclass(frozen=True)
class Change:
    """One group to move to ``release``; ``gpus``: exactly these (install
    names them), or None to keep its count (and its own GPUs when none are free);
    ``weights``: the model file (sha256) it runs from now (None: the same)."""

    group: PlacementGroupRecord
    release: str
    gpus: tuple[str, ...] | None = None
    weights: str | None = None


@dataclass(frozen=True)
class Verdict:
    """A gate's verdict on a replacement held out of clients' traffic."""

    passed: bool
    said: str  # for people: the suite, its score and the minimum
    detail: dict[str, object]  # for --json


# Judges a replacement that is ready but takes no client's request yet (its id).
Vet = Callable[[str], Awaitable[Verdict]]


def weights_of(store: AuthorityStore, pg: PlacementGroupRecord) -> str:
    """The model file a group runs: its own while an update rolls out, else its model's."""
    if pg.artifact_digest is not None:
        return pg.artifact_digest
    svc = store.get_service(pg.service)
    return svc.artifact_digest if svc is not None else ""


def _label(release: str, weights: str | None) -> str:
    return release if weights is None else f"sha256:{weights[:12]}"


def node_name(store: AuthorityStore, node_id: str) -> str:
    node = store.get_node(node_id)
    return node.name if node is not None else node_id


def free_gpus(store: AuthorityStore, node_id: str) -> list[str]:
    node = store.get_node(node_id)
    known = [g["uuid"] for g in ((node.facts or {}) if node else {}).get("gpus", [])]
    held = store.gpus_in_use(node_id)
    return [g for g in known if g not in held]


def cannot_take(store: AuthorityStore, pg: PlacementGroupRecord, release_id: str) -> str | None:
    row = store.get_release(release_id)
    assert row is not None
    if len(store.pg_tasks(pg.id)) > 1 or is_parallel(release_of(row)):
        return "parallel groups are not replaced one task at a time; reinstall them"
    if row["target"] != pg.target:
        return f"release {release_id} is for {row['target']} targets, this group is {pg.target}"
    return None


def check_release(sv: Serving, release_id: str) -> None:
    """The release exists and carries a signature the nodes trust."""
    row = sv.store.get_release(release_id)
    if row is None:
        raise RolloutRefused(
            f"no runtime release {release_id!r} (`letsinfer release list` shows them)", 404
        )
    try:
        runtime.verify(release_of(row), row["signature"], sv.trusted)
    except TrustError as exc:
        raise RolloutRefused(f"release {release_id} cannot run: {exc}") from exc


async def run(
    sv: Serving,
    model: str,
    action: str,
    event: str,
    changes: list[Change],
    *,
    actor: str,
    role: str | None,
    skipped: list[GroupOutcome] | None = None,
    vet: Vet | None = None,
) -> RolloutResult:
    """Apply ``changes`` one group at a time; stop at the first failure.
    ``skipped``: groups already known not to change (listed first); ``vet``:
    the gate the first replacement must pass, held out of clients' traffic,
    before the group it replaces leaves (the rest follow once it has)."""
    store = sv.store
    result = RolloutResult(model, action, list(skipped or []))
    failed = False
    for change in changes:
        pg = store.get_placement_group(change.group.id) or change.group
        now_weights = weights_of(store, pg) if change.weights is not None else None
        out = GroupOutcome(
            pg.id,
            node_name(store, pg.node_id),
            _label(pg.release_id, now_weights),
            _label(change.release, change.weights),
            "",
        )
        result.groups.append(out)
        if failed:
            out.outcome = NOT_TRIED
            continue
        why = cannot_take(store, pg, change.release) or sv.unreachable(pg.node_id)
        if why is not None:
            out.outcome, out.detail = SKIPPED, why
        elif (
            pg.release_id == change.release
            and change.gpus is None
            and now_weights == change.weights
        ):
            out.outcome = UNCHANGED
        else:
            log.info("%s %s: %s on %s -> %s", action, model, pg.id, out.node, out.to_release)
            await _replace(sv, pg, change, event, out, vet)
            if out.gate is not None:
                vet = None  # judged once: the groups after it take what passed
            failed = out.outcome in (RESTORED, FAILED, GATED)
        log.log(logging.WARNING if failed else logging.INFO, "%s %s: %s", action, model, out.line())
    store.append_audit(
        actor,
        action,
        "ok" if result.ok else "failed",
        role=role,
        target=model,
        detail="; ".join(g.line() for g in result.groups)[:2000] or None,
    )
    return result


async def _replace(
    sv: Serving,
    pg: PlacementGroupRecord,
    change: Change,
    event: str,
    out: GroupOutcome,
    vet: Vet | None = None,
) -> None:
    store = sv.store
    if pg.desired != "running":  # nothing runs: it takes the change at its next start
        with store.transaction():
            store.set_pg_release(pg.id, change.release)
            if change.weights is not None:
                store.set_pg_weights(pg.id, change.weights)
            store.add_release_history(pg.service, pg.node_id, pg.id, change.release, event)
        out.outcome, out.detail = UPGRADED, "stopped: runs it at its next start"
        sv.apply()
        return
    own = store.pg_gpus(pg.id)
    if change.gpus is not None:
        beside = None if set(change.gpus) & set(own) else change.gpus
        if beside is None and set(change.gpus) != set(own):
            out.outcome = SKIPPED
            out.detail = (
                f"it would run on {', '.join(change.gpus)}, partly its own GPUs "
                f"({', '.join(own)}); name free GPUs or exactly its own with --gpu"
            )
            return
    else:
        free = free_gpus(store, pg.node_id)
        beside = tuple(free[: len(own)]) if len(free) >= len(own) else None
    if beside is not None:
        await _beside(sv, pg, change, beside, event, out, vet)
    else:
        await _in_place(sv, pg, change, event, out, vet)


@dataclass(frozen=True)
class Swap:
    """How a group started beside the one it replaces went."""

    new_id: str
    started: Started | None  # None: it could not even be recorded (``why``)
    why: str | None = None
    cut: int = 0  # requests still in flight when the old group's drain ended
    verdict: Verdict | None = None  # the gate's, when one judged the new group


async def swap_beside(
    sv: Serving,
    pg: PlacementGroupRecord,
    release_id: str,
    gpus: tuple[str, ...],
    proven: Callable[[str], None] = lambda new_id: None,
    *,
    weights: str | None = None,
    vet: Vet | None = None,
) -> Swap:
    """Start a new group of ``pg``'s model on its node beside it (running
    ``weights`` when given); once the new one is ready (healthy and proven:
    ``proven`` is told its id), drain and remove ``pg``. A new group that does
    not come up is removed, and ``pg`` serves on untouched. With ``vet``, the
    new group takes no client's request until it has passed: one that fails
    is removed the same way. Used by rollouts and by restarts
    (lifecycle/restarts.py)."""
    store = sv.store
    new_id = f"pg-{uuid.uuid4().hex[:12]}"
    try:
        with store.transaction():
            store.add_placement_group(
                new_id, pg.service, pg.node_id, release_id, pg.target, gpus, event=None
            )
            if weights is not None:
                store.set_pg_weights(new_id, weights)
    except StoreError as exc:  # e.g. its GPUs were taken meanwhile
        return Swap(new_id, None, str(exc))
    if vet is not None:
        sv.routing.hold({new_id})  # before it can be published: no client reaches it
    try:
        sv.apply()
        started = await sv.started(new_id)
        verdict = await vet(new_id) if vet is not None and started.ready else None
        if not started.ready or (verdict is not None and not verdict.passed):
            store.delete_placement_group(new_id)
            sv.apply()
            sv.routing.forget(pg.service, new_id)
            return Swap(new_id, started, verdict=verdict)
    finally:
        sv.routing.unhold({new_id})
    proven(new_id)
    left = await sv.drain({pg.id})
    store.delete_placement_group(pg.id)
    sv.apply()
    sv.routing.undrain({pg.id})
    sv.routing.forget(pg.service, pg.id)
    return Swap(new_id, started, cut=left, verdict=verdict)


async def _beside(
    sv: Serving,
    pg: PlacementGroupRecord,
    change: Change,
    gpus: tuple[str, ...],
    event: str,
    out: GroupOutcome,
    vet: Vet | None,
) -> None:
    """Start the replacement beside the old group; drain the old one after."""
    store = sv.store
    release_id = change.release
    swap = await swap_beside(
        sv,
        pg,
        release_id,
        gpus,
        lambda new_id: store.add_release_history(pg.service, pg.node_id, new_id, release_id, event),
        weights=change.weights,
        vet=vet,
    )
    out.gate = swap.verdict
    if swap.started is None:
        out.outcome, out.detail = SKIPPED, f"no room for a replacement beside it: {swap.why}"
        return
    if not swap.started.ready:
        out.outcome = RESTORED
        out.detail = (
            f"its replacement {swap.new_id} on {out.to_release} was {swap.started.why()}; "
            f"removed it, {pg.id} kept serving {out.from_release}"
        )
        return
    if swap.verdict is not None and not swap.verdict.passed:
        out.outcome = GATED
        out.detail = (
            f"its replacement {swap.new_id} on {out.to_release} failed the gate "
            f"({swap.verdict.said}); removed it, {pg.id} kept serving {out.from_release}"
        )
        return
    out.outcome, out.now = UPGRADED, swap.new_id
    passed = f", passed the gate ({swap.verdict.said})" if swap.verdict is not None else ""
    out.detail = (
        f"{swap.new_id} started beside it and proven{passed}; {pg.id} drained and removed"
        + (
            f" ({swap.cut} request(s) still in flight after the drain timeout were cut)"
            if swap.cut
            else ""
        )
    )


async def _in_place(
    sv: Serving,
    pg: PlacementGroupRecord,
    change: Change,
    event: str,
    out: GroupOutcome,
    vet: Vet | None,
) -> None:
    """No spare capacity: drain, replace the engine on the same GPUs, prove it
    (and, with ``vet``, judge it before it admits again); on failure restore
    the exact prior release and weights for this group."""
    store = sv.store
    release_id = change.release
    prior, prior_weights = pg.release_id, pg.artifact_digest
    left = await sv.drain({pg.id})
    if vet is not None:
        sv.routing.hold({pg.id})  # once replaced, only the gate's requests reach it
    try:
        with store.transaction():
            store.set_pg_release(pg.id, release_id)
            if change.weights is not None:
                store.set_pg_weights(pg.id, change.weights)
            store.restart_groups([pg.id])
        sv.apply()
        started = await sv.started(pg.id)
        cut = f" ({left} request(s) in flight were cut after the drain timeout)" if left else ""
        verdict = await vet(pg.id) if vet is not None and started.ready else None
        out.gate = verdict
        if started.ready and (verdict is None or verdict.passed):
            store.add_release_history(pg.service, pg.node_id, pg.id, release_id, event)
            out.outcome = UPGRADED
            passed = f", passed the gate ({verdict.said})" if verdict is not None else ""
            out.detail = f"replaced in place on the same GPUs and proven{passed}{cut}"
            return
        why = started.why() if verdict is None else f"below the gate ({verdict.said})"
        with store.transaction():
            store.set_pg_release(pg.id, prior)
            store.set_pg_weights(pg.id, prior_weights)
            store.restart_groups([pg.id])
        sv.routing.unhold({pg.id})
        sv.apply()
        back = await sv.started(pg.id)
        if back.ready:
            out.outcome = GATED if verdict is not None else RESTORED
            out.detail = f"{out.to_release} was {why}; restored {out.from_release}, serving again"
        else:
            out.outcome = FAILED
            out.detail = (
                f"{out.to_release} was {why}; restored {out.from_release}, which is {back.why()}"
            )
    finally:
        sv.routing.unhold({pg.id})
        sv.routing.undrain({pg.id})


# -- which changes each command asks for ----------------------------------------


def _model(store: AuthorityStore, name: str) -> str:
    svc = store.resolve_service(name)
    if svc is None:
        raise RolloutRefused(f"no model {name!r}", 404)
    if svc.external:
        raise RolloutRefused(
            f"model {svc.name} is external (a provider): it runs no engine release to "
            "upgrade or roll back"
        )
    canary = store.get_canary(svc.name)
    if canary is not None:  # (its promotion finishes the upgrade; its abort ends it)
        raise RolloutRefused(
            f"model {svc.name} has a canary ({canary.pg_id}, {canary.change}): "
            f"`letsinfer model promote {svc.name}` or `letsinfer model abort {svc.name}` first"
        )
    return svc.name


def groups_on(store: AuthorityStore, model: str, nodes: list[str]) -> list[PlacementGroupRecord]:
    groups = store.list_placement_groups(service=model)
    if not groups:
        raise RolloutRefused(f"model {model} has no placement groups (`letsinfer model install`)")
    if not nodes:
        return groups
    ids = set()
    for name in nodes:
        node = store.find_node(name)
        if node is None:
            raise RolloutRefused(f"no node {name!r} (see `letsinfer node list`)", 404)
        ids.add(node.id)
    chosen = [pg for pg in groups if pg.node_id in ids]
    if not chosen:
        raise RolloutRefused(f"model {model} has no placement group on {', '.join(nodes)}")
    return chosen


def upgrade_changes(
    sv: Serving, name: str, release_id: str, nodes: list[str]
) -> tuple[str, list[Change]]:
    model = _model(sv.store, name)
    check_release(sv, release_id)
    return model, [Change(pg, release_id) for pg in groups_on(sv.store, model, nodes)]


def retained(history: list[ReleaseHistoryRecord]) -> list[str]:
    """Releases a model ran, oldest first, each once."""
    return list(dict.fromkeys(h.release_id for h in history))


def previous_release(history: list[ReleaseHistoryRecord], pg: PlacementGroupRecord) -> str | None:
    """The release the group's node ran for this model before its current one."""
    here = [h.release_id for h in history if h.node_id == pg.node_id]
    while here and here[-1] == pg.release_id:
        here.pop()
    return here[-1] if here else None


def rollback_changes(
    sv: Serving, name: str, to: str | None, nodes: list[str]
) -> tuple[str, list[Change], list[GroupOutcome]]:
    """Per group, the release it ran before (or ``to``, which must be one this
    model ran). Groups with nothing to go back to come back as skipped."""
    store = sv.store
    model = _model(store, name)
    history = store.release_history(model)
    kept = retained(history)
    if to is not None:
        if to not in kept:
            raise RolloutRefused(
                f"release {to!r} is not one model {model} ran; retained: "
                f"{', '.join(kept) or 'none'}"
            )
        check_release(sv, to)
    changes, skipped = [], []
    for pg in groups_on(store, model, nodes):
        target = to or previous_release(history, pg)
        if target is None:
            skipped.append(
                GroupOutcome(
                    pg.id,
                    node_name(store, pg.node_id),
                    pg.release_id,
                    pg.release_id,
                    SKIPPED,
                    "no earlier release recorded for it",
                )
            )
            continue
        check_release(sv, target)
        changes.append(Change(pg, target))
    if not changes:
        raise RolloutRefused(f"model {model} has no earlier release to go back to")
    return model, changes, skipped
