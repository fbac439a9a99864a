"""The audit chain's signed head: a writer of the database (who cannot read the
node key or write under etc/) cuts the chain or rewrites it with every later
hash recomputed, and `letsinfer audit verify` names what happened."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from letsinfer import config
from letsinfer.audit.anchor import (
    HeadAnchor,
    SignedHead,
    open_authority,
    sign_head,
    witness,
)
from letsinfer.authority.bootstrap import init_main
from letsinfer.home import Home
from letsinfer.store import AuthorityStore
from letsinfer.trust import pki
from tests.db_writer import cut_audit, rewrite_audit_from
from tests.nodes import letsinfer


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home.under(tmp_path / "home")
    init_main(h, config.load(h.config_file), name="site", default_model=False)
    store = open_authority(h)
    for i in range(5):
        store.append_audit("cli", "model.add", "ok", target=f"m{i}")
    store.close()
    return h


def verify(home: Home) -> tuple[int, str]:
    done = letsinfer(home.etc.parent, "audit", "verify")
    return done.returncode, done.stdout + done.stderr


def rows(home: Home) -> list[tuple]:  # type: ignore[type-arg]
    with sqlite3.connect(home.database) as db:
        return db.execute("SELECT * FROM audit ORDER BY seq").fetchall()


def rewrite_from(home: Home, seq: int, detail: str) -> None:
    rewrite_audit_from(home.database, seq, detail)


def test_an_intact_chain_verifies_with_its_signed_head(home: Home) -> None:
    code, out = verify(home)
    total = len(rows(home))
    assert code == 0, out
    assert f"audit chain intact: {total} records, signed head at record {total}" in out
    assert home.audit_head.stat().st_mode & 0o077 == 0, "the head is the owner's alone"


def test_a_cut_tail_is_named(home: Home) -> None:
    total = len(rows(home))
    cut_audit(home.database, keep=total - 2)
    code, out = verify(home)
    assert code == 1
    assert (
        f"the chain was cut: the signed head covers {total} records, "
        f"but the database ends at record {total - 2}"
    ) in out


def test_a_rewrite_with_every_hash_recomputed_is_named(home: Home) -> None:
    rewrite_from(home, 3, "nothing to see")
    total = len(rows(home))
    code, out = verify(home)
    assert code == 1
    assert "broken at record" not in out, "every link holds: only the head tells"
    assert f"record {total} differs from the signed head: the chain was rewritten" in out


def test_a_head_signed_by_another_key_is_forged(home: Home) -> None:
    tail = rows(home)[-1]
    forged = sign_head(pki.new_key(), tail[0], tail[9])
    home.audit_head.write_text(json.dumps(forged.to_json()))
    code, out = verify(home)
    assert code == 1 and "signature does not verify with this node's key (forged)" in out


def test_appends_without_the_key_are_not_anchored_until_a_signed_one(home: Home) -> None:
    keyless = AuthorityStore(home.database)  # a group member's process: no node key
    keyless.append_audit("cli:alice", "auth.key.create", "ok", target="k")
    keyless.close()
    code, out = verify(home)
    assert code == 0, out
    assert "1 record(s) after the signed head are not anchored yet" in out

    store = open_authority(home)
    store.append_audit("cli", "auth.key.create", "ok", target="k2")
    store.close()
    code, out = verify(home)
    total = len(rows(home))
    assert code == 0 and f"signed head at record {total}" in out
    assert "not anchored" not in out


def test_no_new_head_is_signed_over_a_cut_chain(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    total = len(rows(home))
    cut_audit(home.database, keep=total - 3)
    before = home.audit_head.read_bytes()
    store = open_authority(home)
    with caplog.at_level(logging.ERROR, logger="letsinfer.audit"):
        store.append_audit("cli", "model.add", "ok", target="after-the-cut")
        store.append_audit("cli", "model.add", "ok", target="and-again")
    store.close()
    assert home.audit_head.read_bytes() == before, "the evidence stays"
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "the chain was cut" in caplog.records[0].message
    code, out = verify(home)
    assert code == 1 and "the chain was cut" in out  # records total-2.. are not the old ones


def test_the_main_flags_a_head_that_goes_backwards_or_changes(home: Home) -> None:
    store = open_authority(home)
    node = store.list_nodes()[0]
    key = pki.new_key()
    first = sign_head(key, 10, "a" * 64)
    seen = witness(node, first, None)
    assert seen.problem is None and seen.head == first.to_json()

    store.record_node_facts(node.id, {}, seq=1, witness=seen)
    node = store.get_node(node.id)
    assert node is not None and node.facts_seq == 1 and node.audit_head == first.to_json()
    back = witness(node, sign_head(key, 7, "b" * 64), None)
    assert back.problem is not None and "went backwards" in back.problem
    assert back.head == first.to_json(), "the witnessed head is kept"
    changed = witness(node, sign_head(key, 10, "c" * 64), None)
    assert changed.problem is not None and "went backwards" in changed.problem
    ahead = witness(node, sign_head(key, 11, "d" * 64), "the chain was cut: …")
    assert ahead.problem == "the chain was cut: …", "the node's own finding is kept"
    store.close()


def test_head_files_are_checked_before_use(tmp_path: Path) -> None:
    anchor = HeadAnchor(tmp_path / "head.json", tmp_path / "none.key")
    (tmp_path / "head.json").write_text('{"count": 1e400, "hash": "x", "signature": ""}')
    with pytest.raises(Exception, match="count is not a record number"):
        anchor.read()
    assert SignedHead.from_json({"count": 3, "hash": "0" * 64, "signature": "c2ln"}).count == 3
