"""Canaries of new weights and canaries under a gate: `model update --canary`
starts one group on a new commit beside the others and `model promote` moves
the rest to it; a gate (`--eval S --min-score X`, or `model gate`) judges the
canary's group before it takes its share, and again before a promotion.

The end-to-end tests run on a real main with the local hub the update tests
use (tests/test_model_update.py); the gate's order (held, judged, then given
its share) and a refused promotion are checked without engines."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from letsinfer.config import LifecycleSettings
from letsinfer.contracts.artifacts import artifact_path
from letsinfer.engines.tinymodel import SENTENCE
from letsinfer.gateway.routing import RoutingTable
from letsinfer.lifecycle import canary
from letsinfer.lifecycle.rollout import Verdict
from letsinfer.lifecycle.serving import Serving, Started
from letsinfer.lifecycle.weights import WEIGHTS
from letsinfer.store import AuthorityStore
from letsinfer.store.canaries import CanaryRecord
from tests.hubserver import FakeHub
from tests.nodes import RunningNode, processes_using
from tests.test_model_gate import MODEL, NEW, _replica
from tests.test_model_gate import _store as authority
from tests.test_model_update import PASSES, REPO, audit, chat, groups, ok, publish, sha256_of, shown
from tests.test_model_update import hub as hub  # (the fixtures: a hub, a main, four commits)
from tests.test_model_update import node as node
from tests.test_model_update import weights as weights

NEVER = (
    "name: never-said\nthreshold: 1\ncases:\n"
    "  - messages: [{role: user, content: hi}]\n    expect: {contains: 'no such words'}\n"
)


class Ready(Serving):
    """Every group starts at once (no engines): what the gate's order needs."""

    async def started(self, pg_id: str) -> Started:
        return Started("ready")


def _serving(tmp_path: Path) -> tuple[Ready, AuthorityStore]:
    store, _ = authority(tmp_path)
    return Ready(store, RoutingTable(), lambda: None, LifecycleSettings()), store


@pytest.mark.parametrize("passes", [True, False])
def test_a_gated_canary_is_held_and_has_no_share_until_it_passes(
    tmp_path: Path, passes: bool
) -> None:
    sv, store = _serving(tmp_path)
    old = store.get_placement_group("pg-1")
    assert old is not None
    new_id = canary.add_beside(store, old, old.release_id, (), weights=NEW)
    seen: list[tuple[bool, object]] = []

    async def judge(pg_id: str) -> Verdict:
        # While judged: no client reaches it, and no share is stored for it.
        sv.routing.publish(_replica(pg_id))
        seen.append((sv.routing.held(MODEL, pg_id) is not None, store.get_canary(MODEL)))
        return Verdict(passes, f"suite s scored {int(passes)}.0000", {})

    opened = asyncio.run(
        canary.open_canary(
            sv, MODEL, new_id, 30, kind=WEIGHTS, change="new", replaces="pg-1",
            actor="cli", role=None, vet=judge,
        )
    )  # fmt: skip
    assert seen == [(True, None)]
    assert opened.ok is passes and sv.routing.held(MODEL, new_id) is None
    kept = store.get_canary(MODEL)
    if passes:
        assert kept is not None and (kept.pg_id, kept.percent) == (new_id, 30)
    else:  # removed, and nothing left of it
        assert kept is None and store.get_placement_group(new_id) is None
        assert "failed the gate (suite s scored 0.0000)" in opened.why()
    starts = [a for a in store.list_audit() if a.action == "model.canary.start"]
    assert [a.outcome for a in starts] == ["ok" if passes else "failed"]
    store.close()


def test_a_promotion_below_the_gate_changes_nothing(tmp_path: Path) -> None:
    sv, store = _serving(tmp_path)
    store.add_placement_group(
        "pg-2", MODEL, "main-id", store.list_placement_groups()[0].release_id, "cpu"
    )
    record = CanaryRecord(MODEL, "pg-2", 30, WEIGHTS, "new", "pg-1", time.time(), "cli")
    store.add_canary(record)

    async def judge(pg_id: str) -> Verdict:
        return Verdict(False, f"suite s scored 0.2000, below 0.5 ({pg_id})", {})

    result = asyncio.run(canary.promote(sv, MODEL, actor="cli", role=None, vet=judge))
    assert not result.ok
    [out] = result.groups
    assert (out.group, out.outcome) == ("pg-2", "gated")
    assert "suite s scored 0.2000, below 0.5 (pg-2)" in str(out.detail)
    assert store.get_canary(MODEL) == record
    assert sorted(pg.id for pg in store.list_placement_groups()) == ["pg-1", "pg-2"]
    assert [a.outcome for a in store.list_audit() if a.action == "model.promote"] == ["failed"]
    store.close()


def audit_mark(node: RunningNode) -> int:
    """The newest audit record's seq: what a test counts its records from."""
    newest = json.loads(ok(node.cli("audit", "list", "--limit", "1", "--json")))
    return max((int(r["seq"]) for r in newest), default=0)


def audit_since(node: RunningNode, action: str, mark: int) -> list[dict[str, object]]:
    return [r for r in audit(node, action) if int(str(r["seq"])) > mark]


def given_no_model(node: RunningNode) -> None:
    """No model REPO (a test before may have pulled it)."""
    if node.cli("model", "show", REPO, "--json").returncode == 0:
        ok(node.cli("model", "remove", REPO, "--stop"))


def given_serving(node: RunningNode, hub: FakeHub, weights: dict[str, Path]) -> None:
    """Model REPO pulled (weights a where it is not yet) and answering, with
    no canary and no gate of its own."""
    if node.cli("model", "show", REPO, "--json").returncode != 0:
        publish(hub, weights["a"])
        ok(node.cli("model", "pull", REPO, "--target", "cpu"))
    if node.cli("model", "canary", REPO).returncode == 0:
        ok(node.cli("model", "abort", REPO))
    ok(node.cli("model", "gate", REPO, "--clear"))
    assert chat(node).json()["choices"][0]["message"]["content"] == SENTENCE


def test_an_update_canary_serves_beside_the_old_and_promote_moves_the_rest(
    node: RunningNode, hub: FakeHub, weights: dict[str, Path], tmp_path: Path
) -> None:
    given_no_model(node)
    mark = audit_mark(node)
    commit_a = publish(hub, weights["a"])
    ok(node.cli("model", "pull", REPO, "--target", "cpu"))
    assert chat(node).status_code == 200
    [old] = groups(node)

    commit_b = publish(hub, weights["b"])
    started = json.loads(ok(node.cli("model", "update", REPO, "--canary", "30", "--json")))
    [out] = started["placement_groups"]
    assert (out["group"], out["outcome"]) == (old, "canary"), started
    new = out["now"]
    assert started["weights"]["model_runs_them"] is False
    assert groups(node) == sorted([old, new])
    assert shown(node)["commit"] == commit_a  # the model's own weights wait for the promotion
    split = json.loads(ok(node.cli("model", "canary", REPO, "--json")))
    assert (split["group"], split["kind"], split["percent"]) == (new, "weights", 30)
    assert commit_b[:12] in split["change"]
    store = node.home / "var" / "models"
    assert processes_using(artifact_path(store, sha256_of(weights["b"])))

    # A gate the canary fails refuses the promotion: the canary stays as it was.
    never = tmp_path / "never.yaml"
    never.write_text(NEVER)
    ok(node.cli("model", "gate", REPO, "--suite", str(never), "--min-score", "0.5"))
    refused = node.cli("model", "promote", REPO, "--json")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    [gated] = json.loads(refused.stdout)["placement_groups"]
    assert (gated["group"], gated["outcome"]) == (new, "gated")
    assert (gated["gate"]["score"], gated["gate"]["passed"]) == (0.0, False)
    assert "below 0.5" in gated["detail"]
    assert groups(node) == sorted([old, new])
    assert json.loads(ok(node.cli("model", "canary", REPO, "--json")))["group"] == new
    assert audit_since(node, "model.gate", mark)[-1]["outcome"] == "failed"
    ok(node.cli("model", "gate", REPO, "--clear"))

    promoted = json.loads(ok(node.cli("model", "promote", REPO, "--json")))
    assert [(g["group"], g["outcome"], g["now"]) for g in promoted["placement_groups"]] == [
        (old, "upgraded", new)
    ]
    assert groups(node) == [new]
    info = shown(node)
    assert (info["commit"], info["sha256"]) == (commit_b, sha256_of(weights["b"]))
    assert [w["commit"] for w in info["weights"]] == [commit_a, commit_b]  # type: ignore[union-attr]
    assert chat(node).json()["choices"][0]["message"]["content"] == SENTENCE
    deadline = time.monotonic() + 30
    while processes_using(artifact_path(store, sha256_of(weights["a"]))):
        assert time.monotonic() < deadline, "an engine still runs commit a"
        time.sleep(0.2)
    gone = node.cli("model", "canary", REPO)
    assert gone.returncode == 1 and "has no canary" in gone.stderr


def test_a_canary_below_the_gate_is_removed_and_the_old_serves_on(
    node: RunningNode, hub: FakeHub, weights: dict[str, Path], tmp_path: Path
) -> None:
    given_serving(node, hub, weights)
    mark = audit_mark(node)
    suite = tmp_path / "says-it-all.yaml"
    suite.write_text(PASSES)
    serving, before = shown(node), groups(node)
    publish(hub, weights["short"])
    result = node.cli(
        "model", "update", REPO, "--canary", "30", "--eval", str(suite), "--min-score", "0.5",
        "--json",
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "stopped" in result.stderr
    [out] = json.loads(result.stdout)["placement_groups"]
    assert out["outcome"] == "gated"
    assert "suite says-it-all scored 0.0000, below 0.5" in out["detail"]
    assert out["gate"]["group"] not in before
    assert groups(node) == before
    info = shown(node)
    assert (info["commit"], info["sha256"]) == (serving["commit"], serving["sha256"])
    assert len(info["weights"]) == len(serving["weights"])  # type: ignore[arg-type]
    gone = node.cli("model", "canary", REPO)
    assert gone.returncode == 1 and "has no canary" in gone.stderr
    assert chat(node).json()["choices"][0]["message"]["content"] == SENTENCE
    gate = audit_since(node, "model.gate", mark)[-1]
    assert gate["outcome"] == "failed" and "score=0.0000" in str(gate["detail"])
    assert audit_since(node, "model.canary.start", mark)[-1]["outcome"] == "failed"
