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
from collections.abc import Callable
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

    def to_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "node": self.node,
            "from": self.from_release,
            "to": self.to_release,
            "outcome": self.outcome,
            "detail": self.detail,
            "now": self.now or self.group,
        }

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
        return not any(g.outcome in (RESTORED, FAILED) for g in self.groups)

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
    names them), or None to keep its count (and its own GPUs when none are free)."""

    group: PlacementGroupRecord
    release: str
    gpus: tuple[str, ...] | None = None


def _node_name(store: AuthorityStore, node_id: str) -> str:
    node = store.get_node(node_id)
    return node.name if node is not None else node_id


def free_gpus(store: AuthorityStore, node_id: str) -> list[str]:
    node = store.get_node(node_id)
    known = [g["uuid"] for g in ((node.facts or {}) if node else {}).get("gpus", [])]
    held = store.gpus_in_use(node_id)
    return [g for g in known if g not in held]


def _cannot_take(store: AuthorityStore, pg: PlacementGroupRecord, release_id: str) -> str | None:
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
) -> RolloutResult:
    """Apply ``changes`` one group at a time; stop at the first failure.
    ``skipped``: groups already known not to change (listed first)."""
    store = sv.store
    result = RolloutResult(model, action, list(skipped or []))
    failed = False
    for change in changes:
        pg = store.get_placement_group(change.group.id) or change.group
        out = GroupOutcome(pg.id, _node_name(store, pg.node_id), pg.release_id, change.release, "")
        result.groups.append(out)
        if failed:
            out.outcome = NOT_TRIED
            continue
        why = _cannot_take(store, pg, change.release) or sv.unreachable(pg.node_id)
        if why is not None:
            out.outcome, out.detail = SKIPPED, why
        elif pg.release_id == change.release and change.gpus is None:
            out.outcome = UNCHANGED
        else:
            log.info("%s %s: %s on %s -> %s", action, model, pg.id, out.node, change.release)
            await _replace(sv, pg, change, event, out)
            failed = out.outcome in (RESTORED, FAILED)
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
    sv: Serving, pg: PlacementGroupRecord, change: Change, event: str, out: GroupOutcome
) -> None:
    store = sv.store
    if pg.desired != "running":  # nothing runs: it takes the release at its next start
        with store.transaction():
            store.set_pg_release(pg.id, change.release)
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
        await _beside(sv, pg, change.release, beside, event, out)
    else:
        await _in_place(sv, pg, change.release, event, out)


@dataclass(frozen=True)
class Swap:
    """How a group started beside the one it replaces went."""

    new_id: str
    started: Started | None  # None: it could not even be recorded (``why``)
    why: str | None = None
    cut: int = 0  # requests still in flight when the old group's drain ended


async def swap_beside(
    sv: Serving,
    pg: PlacementGroupRecord,
    release_id: str,
    gpus: tuple[str, ...],
    proven: Callable[[str], None] = lambda new_id: None,
) -> Swap:
    """Start a new group of ``pg``'s model on its node beside it; once the new
    one is ready (healthy and proven: ``proven`` is told its id), drain and
    remove ``pg``. A new group that does not come up is removed, and ``pg``
    serves on untouched. Used by rollouts and by restarts (lifecycle/restarts.py)."""
    store = sv.store
    new_id = f"pg-{uuid.uuid4().hex[:12]}"
    try:
        store.add_placement_group(
            new_id, pg.service, pg.node_id, release_id, pg.target, gpus, event=None
        )
    except StoreError as exc:  # e.g. its GPUs were taken meanwhile
        return Swap(new_id, None, str(exc))
    sv.apply()
    started = await sv.started(new_id)
    if not started.ready:
        store.delete_placement_group(new_id)
        sv.apply()
        sv.routing.forget(pg.service, new_id)
        return Swap(new_id, started)
    proven(new_id)
    left = await sv.drain({pg.id})
    store.delete_placement_group(pg.id)
    sv.apply()
    sv.routing.undrain({pg.id})
    sv.routing.forget(pg.service, pg.id)
    return Swap(new_id, started, cut=left)


async def _beside(
    sv: Serving,
    pg: PlacementGroupRecord,
    release_id: str,
    gpus: tuple[str, ...],
    event: str,
    out: GroupOutcome,
) -> None:
    """Start the replacement beside the old group; drain the old one after."""
    store = sv.store
    swap = await swap_beside(
        sv,
        pg,
        release_id,
        gpus,
        lambda new_id: store.add_release_history(pg.service, pg.node_id, new_id, release_id, event),
    )
    if swap.started is None:
        out.outcome, out.detail = SKIPPED, f"no room for a replacement beside it: {swap.why}"
        return
    if not swap.started.ready:
        out.outcome = RESTORED
        out.detail = (
            f"its replacement {swap.new_id} on {release_id} was {swap.started.why()}; "
            f"removed it, {pg.id} kept serving {pg.release_id}"
        )
        return
    out.outcome, out.now = UPGRADED, swap.new_id
    out.detail = f"{swap.new_id} started beside it and proven; {pg.id} drained and removed" + (
        f" ({swap.cut} request(s) still in flight after the drain timeout were cut)"
        if swap.cut
        else ""
    )


async def _in_place(
    sv: Serving, pg: PlacementGroupRecord, release_id: str, event: str, out: GroupOutcome
) -> None:
    """No spare capacity: drain, replace the engine on the same GPUs, prove it;
    on failure restore the exact prior release for this group."""
    store = sv.store
    prior = pg.release_id
    left = await sv.drain({pg.id})
    try:
        with store.transaction():
            store.set_pg_release(pg.id, release_id)
            store.restart_groups([pg.id])
        sv.apply()
        started = await sv.started(pg.id)
        cut = f" ({left} request(s) in flight were cut after the drain timeout)" if left else ""
        if started.ready:
            store.add_release_history(pg.service, pg.node_id, pg.id, release_id, event)
            out.outcome = UPGRADED
            out.detail = f"replaced in place on the same GPUs and proven{cut}"
            return
        with store.transaction():
            store.set_pg_release(pg.id, prior)
            store.restart_groups([pg.id])
        sv.apply()
        back = await sv.started(pg.id)
        if back.ready:
            out.outcome = RESTORED
            out.detail = f"{release_id} was {started.why()}; restored {prior}, serving again"
        else:
            out.outcome = FAILED
            out.detail = (
                f"{release_id} was {started.why()}; restored {prior}, which is {back.why()}"
            )
    finally:
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
    return svc.name


def _groups_on(store: AuthorityStore, model: str, nodes: list[str]) -> list[PlacementGroupRecord]:
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
    return model, [Change(pg, release_id) for pg in _groups_on(sv.store, model, nodes)]


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
    for pg in _groups_on(store, model, nodes):
        target = to or previous_release(history, pg)
        if target is None:
            skipped.append(
                GroupOutcome(
                    pg.id,
                    _node_name(store, pg.node_id),
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
