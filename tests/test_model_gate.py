"""The parts of weight updates and gates that need no running node: a group held
out of clients' traffic (what a gate judges), a group told to run its own
weights while an update rolls out, the weights a model ran kept for a
rollback, and a gate's minimum score checked. (tests/test_model_update.py runs
them on a real main.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from letsinfer.authority.placements import desired_for_node
from letsinfer.config import LifecycleSettings
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.engines.releases import xllamacpp_release
from letsinfer.evals.gate import GateSpec, check_min_score, read_spec
from letsinfer.evals.suite import SuiteError
from letsinfer.gateway.admission import Admission, AdmissionLimits
from letsinfer.gateway.policy import RoutingPolicy
from letsinfer.gateway.routing import Replica, RoutingTable
from letsinfer.lifecycle import weights
from letsinfer.lifecycle.rollout import RolloutRefused, Verdict, Vet, weights_of
from letsinfer.lifecycle.serving import Serving
from letsinfer.store import AuthorityStore

MODEL = "m"
OLD, NEW = "a" * 64, "b" * 64


def _replica(pg: str) -> Replica:
    return Replica(pg, MODEL, "http://127.0.0.1:1", "Bearer x", capacity=1000)


def test_a_held_group_takes_no_clients_request_only_one_pinned_to_it() -> None:
    routing = RoutingTable()
    routing.publish(_replica("pg-old"))
    routing.hold({"pg-new"})  # held before it is published, as a rollout does
    routing.publish(_replica("pg-new"))
    admission = Admission(routing, RoutingPolicy(), AdmissionLimits())
    for _ in range(50):  # the old group is the less loaded one after each
        replica = admission.take_now(MODEL)
        assert replica is not None and replica.pg_id == "pg-old"
    assert admission.take_now(MODEL, exclude=frozenset({"pg-old"})) is None
    # The upstream gives the request pinned to it its slot (letsinfer.gateway.upstream).
    held = routing.held(MODEL, "pg-new")
    assert held is not None and held.pg_id == "pg-new"
    assert routing.held(MODEL, "pg-old") is None

    routing.unhold({"pg-new"})
    replica = admission.take_now(MODEL)
    assert replica is not None and replica.pg_id == "pg-new"  # the less loaded now
    assert routing.held(MODEL, "pg-new") is None


def _store(tmp_path: Path) -> tuple[AuthorityStore, str]:
    store = AuthorityStore(tmp_path / "authority.db")
    store.add_node("main-id", "main", "main", None)
    release = xllamacpp_release("0.1", "0" * 64)
    store.ensure_release(
        release.id,
        release.engine,
        release.version,
        release.target,
        release.artifacts,
        release.launch,
        "sig",
    )
    store.add_service(MODEL, OLD, 1, "gguf", None, origin={"repo": "o/m", "commit": "c0ffee0ld"})
    store.add_placement_group("pg-1", MODEL, "main-id", release.id, "cpu")
    return store, release.id


def test_a_group_runs_its_own_weights_until_they_become_its_models(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    secret = b"s" * 32
    [placed] = desired_for_node(store, "main-id", secret)
    assert placed.artifact_digest == OLD

    store.set_pg_weights("pg-1", NEW)
    [placed] = desired_for_node(store, "main-id", secret)
    assert placed.artifact_digest == NEW
    pg = store.get_placement_group("pg-1")
    assert pg is not None and weights_of(store, pg) == NEW

    store.set_service_weights(MODEL, NEW, 2, {"repo": "o/m", "commit": "c-new"})
    pg = store.get_placement_group("pg-1")
    assert pg is not None and pg.artifact_digest is None  # the model's own now
    svc = store.get_service(MODEL)
    assert svc is not None and (svc.artifact_digest, svc.origin) == (
        NEW,
        {"repo": "o/m", "commit": "c-new"},
    )
    [again] = desired_for_node(store, "main-id", secret)
    assert again.artifact_digest == NEW
    assert again.fingerprint() == placed.fingerprint()  # no restart for the switch
    store.close()


def test_kept_weights_and_gates_go_with_their_model(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    store.add_weights_history(MODEL, OLD, 1, {"commit": "c-old"}, "added")
    store.add_weights_history(MODEL, NEW, 2, {"commit": "c-new"}, "updated")
    assert [(w.commit, w.event) for w in store.weights_history(MODEL)] == [
        ("c-old", "added"),
        ("c-new", "updated"),
    ]
    refs = {(r.digest, r.holder_kind) for r in store.list_artifact_references()}
    assert (OLD, "kept weights") in refs  # not unreferenced: a rollback needs it
    store.set_gate(MODEL, "arithmetic", 0.8, "cli")
    store.set_gate(MODEL, "json-format", 0.5, "cli")
    gate = store.get_gate(MODEL)
    assert gate is not None and (gate.suite, gate.min_score) == ("json-format", 0.5)
    store.delete_service(MODEL)
    assert store.weights_history(MODEL) == [] and store.get_gate(MODEL) is None
    store.close()


def test_a_gate_is_checked_before_anything_runs(tmp_path: Path) -> None:
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="score from 0 to 1"):
            check_min_score(bad)
    with pytest.raises(SuiteError, match="no such file, nor a built-in suite"):
        read_spec(str(tmp_path / "missing.yaml"), 0.5)
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "name: s\nthreshold: 1\ncases:\n  - messages: [{role: user, content: hi}]\n"
        "    expect: {contains: Hello}\n"
    )
    spec = read_spec(str(suite), 0.5)
    # Sent with its text: the main's service need not be able to read the file.
    suite.unlink()
    assert spec.text is not None and spec.load().name == "s"
    assert GateSpec("arithmetic", 0.8).load().name == "arithmetic"


def test_a_model_with_no_group_loaded_takes_new_weights_at_its_next_load(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    store.delete_placement_group("pg-1")  # unloaded (on demand), or never placed
    models = tmp_path / "models"
    artifact_path(models, NEW).parent.mkdir(parents=True)
    artifact_path(models, NEW).write_bytes(b"GGUF")
    sv = Serving(store, RoutingTable(), lambda: None, LifecycleSettings())
    new = weights.Weights(NEW, 4, {"repo": "o/m", "commit": "c-new"})

    async def judge(pg_id: str) -> Verdict:
        raise AssertionError("nothing to judge")

    def roll(vet: Vet | None) -> dict[str, object]:
        return asyncio.run(
            weights.roll(
                sv,
                models,
                MODEL,
                new,
                action=weights.UPDATE,
                event="updated",
                nodes=[],
                vet=vet,
                actor="cli",
                role=None,
            )
        )

    with pytest.raises(RolloutRefused, match="no placement group to judge"):
        roll(judge)
    svc = store.get_service(MODEL)
    assert svc is not None and svc.artifact_digest == OLD and store.weights_history(MODEL) == []

    assert roll(None)["ok"] is True
    svc = store.get_service(MODEL)
    assert svc is not None and svc.artifact_digest == NEW
    assert [(w.commit, w.event) for w in store.weights_history(MODEL)] == [
        ("c0ffee0ld", "added"),
        ("c-new", "updated"),
    ]
    # A rollback finds the old commit by its start.
    back = weights.rollback_target(store, models, MODEL, "c0ffee0")
    assert back.digest == OLD
    with pytest.raises(RolloutRefused, match="never ran weights"):
        weights.rollback_target(store, models, MODEL, "deadbeef")
    store.close()
