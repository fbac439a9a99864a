"""The state every display shows (letsinfer.authority.states), case by case:
what the authority's rows say, weighed with what they cannot know."""

from __future__ import annotations

import time
from dataclasses import replace

from letsinfer.authority.states import GROUP_STATES, MODEL_STATES, Scene
from letsinfer.store import NodeRecord, PlacementGroupRecord

NOW = time.time()
MAIN = NodeRecord("m", "main", "main", None, "active", False, NOW - 3600, last_seen=None)
CHILD = NodeRecord(
    "c", "gpu-1", "child", "10.0.0.2:8444", "active", False, NOW - 3600, last_seen=NOW - 2
)


def group(**kw: object) -> PlacementGroupRecord:
    fields: dict[str, object] = {
        "id": "pg-1", "service": "m1", "node_id": "m", "release_id": "r", "target": "cpu",
        "desired": "running", "state": "ready", "endpoint": "http://127.0.0.1:1", "pid": 9,
        "capacity": 4, "restarts": 0, "detail": None, "created_at": NOW, "updated_at": NOW,
        "generation": 2, "observed_generation": 2,
    }  # fmt: skip
    fields.update(kw)
    return PlacementGroupRecord(**fields)  # type: ignore[arg-type]


def scene(**kw: object) -> Scene:
    fields: dict[str, object] = {
        "cluster_stopped": False,
        "main_running": True,
        "nodes": {"m": MAIN, "c": CHILD},
        "stale_after_s": 20.0,
        "now": NOW,
    }
    fields.update(kw)
    return Scene(**fields)  # type: ignore[arg-type]


def test_a_group_is_shown_as_the_gateway_treats_it() -> None:
    s = scene()
    assert s.group_state(group()) == "ready"
    assert s.group_state(group(node_id="c")) == "ready"
    paused = {"m": replace(MAIN, paused=True), "c": CHILD}
    silent = {"m": MAIN, "c": replace(CHILD, last_seen=NOW - 60)}
    cases = [
        (scene(cluster_stopped=True), group(), "system stopped"),
        (s, group(desired="stopped", state="stopped"), "stopped"),
        (s, group(desired="stopped", state="ready"), "stopping"),
        (scene(main_running=False), group(desired="stopped"), "stopped"),
        (scene(main_running=False), group(), "down"),
        (scene(nodes=silent), group(node_id="c"), "unreachable"),
        (s, group(node_id="gone"), "unreachable"),
        (scene(nodes=paused), group(), "paused"),
        (s, group(paused_reason="data link to gpu-1 lost"), "paused"),
        (scene(draining=frozenset({"pg-1"})), group(), "draining"),
        (s, group(observed_generation=1), "starting"),  # restarted, not seen since
        (s, group(state="stopped"), "starting"),  # `model start` asked, not seen yet
        (s, group(state="pending"), "starting"),  # `cluster start`
        (s, group(state="parked", detail="bad file"), "parked"),
        (s, group(state="restarting"), "restarting"),
    ]  # fmt: skip
    for sc, pg, want in cases:
        assert sc.group_state(pg) == want, (pg, want)
        assert want in GROUP_STATES or want in ("parked", "restarting")


def test_a_model_is_shown_from_its_groups() -> None:
    s = scene()
    two = [group(), group(id="pg-2", node_id="c")]
    assert s.model_state(two) == "serving"
    assert s.model_state([]) == "not placed"
    assert scene(cluster_stopped=True).model_state(two) == "system stopped"
    assert s.model_state([group(desired="stopped", state="stopped")]) == "stopped"
    assert s.model_state([group(state="parked"), group(id="pg-2", desired="stopped")]) == "parked"
    assert s.model_state([group(state="parked"), group(id="pg-2", state="failed")]) == "failed"
    assert (
        scene(nodes={"m": replace(MAIN, paused=True), "c": CHILD}).model_state([group()])
        == "paused"
    )
    assert s.model_state([group(state="starting"), group(id="pg-2", state="parked")]) == "starting"
    assert scene(main_running=False).model_state(two) == "down"
    for sc, pgs in ((s, two), (scene(cluster_stopped=True), two), (s, [])):
        assert sc.model_state(pgs) in MODEL_STATES


def test_a_node_is_shown_with_its_liveness_and_admission() -> None:
    s = scene()
    assert s.node_state(MAIN) == "active"
    assert scene(main_running=False).node_state(MAIN) == "down"
    assert s.node_state(replace(MAIN, paused=True)) == "paused"
    assert s.node_state(CHILD) == "active"
    assert s.node_state(replace(CHILD, last_seen=NOW - 60, paused=True)) == "unreachable"
    assert s.node_state(replace(CHILD, state="removed")) == "removed"
