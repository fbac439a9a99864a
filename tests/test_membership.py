"""Membership rules without servers: removing a node takes its work, a removed
name is free again, and a former main's authority is retired all at once."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from letsinfer.authority import retirement
from letsinfer.authority.adoption import main_blockers
from letsinfer.authority.removal import RemovalRefused, remove_node
from letsinfer.contracts.work import ChildWork
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity, save_identity
from letsinfer.release import runtime
from letsinfer.store import AuthorityStore, StoreError, TaskSpec
from letsinfer.store.migrations import MIGRATIONS
from tests.nodes import letsinfer


def cluster_store(path: Path) -> AuthorityStore:
    store = AuthorityStore(path)
    store.add_node("m", "main", "main", None)
    store.add_node("c1", "n1", "child", "10.0.0.2:8444", "fp-n1")
    store.add_node("c2", "n2", "child", "10.0.0.3:8444", "fp-n2")
    store.ensure_release("r1", "llama-server", "1", "cuda", {}, {})
    store.add_service("m1", "d" * 64, 1, "gguf", None)
    store.add_service("m2", "e" * 64, 1, "gguf", None)
    store.add_placement_group("pg-a", "m1", "c1", "r1", "cuda", ("GPU-1",))
    store.add_placement_group("pg-b", "m2", "c2", "r1", "cuda", ("GPU-2",))
    store.add_parallel_placement_group(  # spans n2 and n1: goes whole with n1
        "pg-p",
        "m2",
        "r1",
        "cuda",
        [
            TaskSpec("0", "c2", "10.0.0.3", 20000, ("GPU-3",)),
            TaskSpec("1", "c1", "10.0.0.2", 20000),
        ],
    )
    return store


def test_removing_a_node_takes_its_work_and_frees_its_name(tmp_path: Path) -> None:
    store = cluster_store(tmp_path / "a.db")
    done = remove_node(store, "n1", actor="cli")
    assert {(g.pg_id, g.service) for g in done.groups} == {("pg-a", "m1"), ("pg-p", "m2")}
    assert [pg.id for pg in store.list_placement_groups()] == ["pg-b"]
    assert store.gpus_in_use("c1") == set() and store.gpus_in_use("c2") == {"GPU-2"}
    assert store.is_revoked("fp-n1")
    [row] = [n for n in store.list_nodes(include_removed=True) if n.id == "c1"]
    assert row.state == "removed" and row.removed_at is not None
    assert "n1" not in {n.name for n in store.list_nodes()}
    last = store.list_audit()[-1]
    assert (last.action, last.outcome, last.target) == ("node.remove", "ok", "n1")
    assert "pg-a (m1)" in str(last.detail) and "fp-n1" in str(last.detail)

    # The name is free for a wiped host (a new id); the old row stays for the record.
    store.add_node("c9", "n1", "child", "10.0.0.2:8444", "fp-n1-new")
    store.add_placement_group("pg-c", "m1", "c9", "r1", "cuda", ("GPU-1",))  # GPU-1 is free
    assert sorted(n.id for n in store.list_nodes(include_removed=True) if n.name == "n1") == [
        "c1",
        "c9",
    ]
    with pytest.raises(StoreError):  # still one live node per name
        store.add_node("c10", "n1", "child", None)
    with pytest.raises(StoreError):  # and a removed id never comes back
        store.add_node("c1", "n1-again", "child", None)

    # Refusals change nothing.
    before = (store.list_placement_groups(), store.list_nodes(include_removed=True))
    for name, why in (
        ("main", "the main cannot remove itself"),
        ("nope", "no node 'nope'"),
        ("c1", "already removed"),
    ):
        with pytest.raises(RemovalRefused, match=why):
            remove_node(store, name, actor="cli")
    assert (store.list_placement_groups(), store.list_nodes(include_removed=True)) == before


def test_a_version_4_authority_migrates_with_its_references_intact(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for number, script in enumerate(MIGRATIONS[:4], start=1):
        conn.executescript(script)
        conn.execute(f"PRAGMA user_version = {number}")
    conn.executescript(
        """
        INSERT INTO nodes(id, name, role, state, created_at) VALUES ('m', 'main', 'main',
            'active', 1), ('c1', 'n1', 'child', 'active', 1);
        INSERT INTO runtime_releases(id, engine, version, target, created_at)
            VALUES ('r1', 'xllamacpp', '1', 'cpu', 1);
        INSERT INTO model_services(name, artifact_digest, artifact_size, format, created_at)
            VALUES ('m1', 'd', 1, 'gguf', 1);
        INSERT INTO placement_groups(id, service, node_id, release_id, target, created_at,
            updated_at) VALUES ('pg-a', 'm1', 'c1', 'r1', 'cpu', 1, 1);
        INSERT INTO pg_tasks(pg_id, task, node_id, updated_at) VALUES ('pg-a', '0', 'c1', 1);
        INSERT INTO pg_devices(gpu_uuid, pg_id, node_id) VALUES ('GPU-1', 'pg-a', 'c1');
        """
    )
    conn.close()
    store = AuthorityStore(path)
    assert store.schema_version() == len(MIGRATIONS)
    assert {n.name for n in store.list_nodes()} == {"main", "n1"}
    assert store.pg_gpus("pg-a") == ["GPU-1"]
    with pytest.raises(StoreError):
        store.add_node("m2", "main2", "main", None)  # still exactly one main
    with pytest.raises(sqlite3.IntegrityError):  # foreign keys still hold
        store.db.execute("DELETE FROM nodes WHERE id = 'c1'")
    remove_node(store, "n1", actor="cli")
    assert store.pg_gpus("pg-a") == [] and store.get_placement_group("pg-a") is None


def test_what_blocks_a_move(tmp_path: Path) -> None:
    store = cluster_store(tmp_path / "a.db")
    found = " ".join(main_blockers(store))
    assert "pg-a (m1)" in found and "attached children: n1, n2" in found
    for pg in store.list_placement_groups():
        store.set_service_desired(pg.service, "stopped")
    remove_node(store, "n1", actor="cli")
    remove_node(store, "n2", actor="cli")
    assert main_blockers(store) == []

    # A child: the main's word and the engines it runs now both count.
    held = [{"id": "pg-a", "model": "m1", "state": "ready"}]
    assert "pg-a (m1)" in ChildWork(held, None, [{"pg_id": "pg-a", "state": "ready"}]).blockers()[0]
    running = ChildWork(None, "unreachable", [{"pg_id": "pg-x", "state": "ready"}])
    assert "engines running here: pg-x" in running.blockers()[0]
    idle = ChildWork(None, "unreachable at 10.0.0.1:8443: timed out", [])
    assert idle.blockers() == [] and "could not be asked" in str(idle.note())
    assert ChildWork([], None, []).note() is None


def main_home(tmp_path: Path) -> tuple[Home, NodeIdentity]:
    home = Home.under(tmp_path / "home")
    home.ensure()
    ident = NodeIdentity("m1", "main", "main", main_id="m1", cluster="c" * 64)
    save_identity(home.identity_file, ident)
    (home.cluster_dir(ident.cluster or "") / "ca.crt").parent.mkdir(parents=True)
    (home.cluster_dir(ident.cluster or "") / "ca.crt").write_text("CA")
    home.ca_key.parent.mkdir(parents=True)
    home.ca_key.write_text("CA KEY")
    runtime.ensure_cluster_key(home)
    store = AuthorityStore(home.database)
    store.append_audit("up", "node.init", "ok")
    store.close()
    return home, ident


def test_a_former_mains_authority_retires_all_at_once(tmp_path: Path) -> None:
    home, ident = main_home(tmp_path)
    # Not committed (node.json still says main): the journal is dropped, nothing moves.
    retirement.prepare(home, ident)
    assert retirement.complete(home) is None
    assert home.database.exists() and home.ca_key.exists()
    assert not retirement.journal_path(home).exists()
    assert list((home.var / "retired").iterdir()) == []

    # Committed, then interrupted before the retirement ran: the next start finishes it.
    resting = retirement.prepare(home, ident)
    save_identity(home.identity_file, replace(ident, role="child", cluster="d" * 64))
    assert retirement.pending(home)
    assert retirement.complete(home) == resting
    assert not home.ca_key.exists() and not runtime.cluster_key_path(home).exists()
    assert (resting / "ca.crt").read_text() == "CA"
    kept = AuthorityStore(resting / "authority.db")
    assert [r.action for r in kept.list_audit()] == ["node.init"]
    kept.close()
    fresh = AuthorityStore(home.database)  # this node's own chain starts over
    assert [r.action for r in fresh.list_audit()] == ["node.authority.retire"]
    fresh.close()
    assert retirement.complete(home) is None  # done once


def test_node_remove_without_a_running_main(tmp_path: Path) -> None:
    """No node runs on the main's home: the CLI writes the authority itself and
    tries to tell the node; an unreachable node is told at its next report."""
    home = tmp_path / "main"
    assert letsinfer(home, "node", "init", "--main", "--name", "main").returncode == 0
    store = AuthorityStore(home / "var/authority.db")
    main_id = store.list_nodes()[0].id
    store.add_node("c1", "n1", "child", "127.0.0.1:9", "fp-n1")
    [tiny] = store.list_placement_groups(node_id=main_id)
    store.add_placement_group("pg-n1", "tiny", "c1", tiny.release_id, "cpu")
    store.close()

    done = letsinfer(home, "node", "remove", "n1", "--json")
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["placement_groups"] == [{"id": "pg-n1", "model": "tiny"}]
    assert said["told"] is False and "cannot reach it at 127.0.0.1:9" in said["notice"]
    again = letsinfer(home, "node", "remove", "n1")
    assert again.returncode == 1 and "already removed" in again.stderr
    assert "Nothing changed" in again.stderr
    listed = json.loads(letsinfer(home, "node", "list", "--all", "--json").stdout)
    # (no node process runs from this home: the main is down)
    assert [(n["name"], n["state"]) for n in listed] == [("main", "down"), ("n1", "removed")]
    store = AuthorityStore(home / "var/authority.db")
    actions = [(r.action, r.outcome) for r in store.list_audit()]
    store.close()
    assert actions[-3:] == [
        ("node.remove", "ok"),
        ("node.remove.notify", "failed"),
        ("node.remove", "denied"),
    ]
