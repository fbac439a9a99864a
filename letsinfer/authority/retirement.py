"""Retiring a main's authority when it joins another cluster (`node accept` on a main).

The move commits when node.json switches to the new cluster
(trust/candidate.py). Just before that, a journal names what to retire; just
after, the retirement runs: in the CLI when no node runs on this home, else in
the running node once its main planes have stopped (it holds the database
open). Whatever starts next on this home finishes an interrupted retirement
first, and a journal beside a node.json that still says main is a move that
never committed: it is dropped. So the authority is retired all at once or
not at all, as far as anything that runs here can see.

Kept aside, under ``var/retired/<time>-<cluster>/`` (0700): the authority
database (its audit chain and records) and the old CA certificate. Deleted:
the CA key and the cluster's release-signing key, so nothing can issue
certificates or sign releases for the old cluster again. Model files stay.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from letsinfer.home import Home
from letsinfer.identity import NodeIdentity, load_identity
from letsinfer.release import runtime
from letsinfer.store import AuthorityStore

_DB_SUFFIXES = ("", "-wal", "-shm")


def journal_path(home: Home) -> Path:
    return home.var / "retire-authority.json"


def prepare(home: Home, identity: NodeIdentity) -> Path:
    """Before the commit: the journal, and a folder holding the old CA certificate
    (the move deletes the old cluster's directory). Returns where it will rest."""
    assert identity.role == "main" and identity.cluster is not None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    final = home.var / "retired" / f"{stamp}-{identity.cluster[:16]}"
    partial = final.with_name(final.name + ".partial")
    partial.mkdir(parents=True, mode=0o700)
    ca = home.cluster_dir(identity.cluster) / "ca.crt"
    if ca.exists():
        shutil.copy2(ca, partial / "ca.crt")
    tmp = journal_path(home).with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"cluster": identity.cluster, "partial": str(partial), "final": str(final)})
    )
    tmp.replace(journal_path(home))
    return final


def abandon(home: Home) -> None:
    """The move did not commit: forget the journal and its folder."""
    journal = _journal(home)
    if journal is not None:
        shutil.rmtree(journal["partial"], ignore_errors=True)
    journal_path(home).unlink(missing_ok=True)


def _journal(home: Home) -> dict[str, str] | None:
    try:
        data = json.loads(journal_path(home).read_text())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def pending(home: Home) -> bool:
    """A committed move whose retirement has not finished. A journal beside a
    node.json that still says main is a move that never committed: dropped."""
    if _journal(home) is None:
        return False
    identity = load_identity(home.identity_file)
    if identity is not None and identity.role == "main":
        abandon(home)
        return False
    return True


def complete(home: Home) -> Path | None:
    """Retire the old authority (idempotent; only while nothing holds the database
    open). Returns where it rests, or None when nothing was pending."""
    if not pending(home):
        return None
    journal = _journal(home)
    assert journal is not None
    partial, final = Path(journal["partial"]), Path(journal["final"])
    if partial.exists():
        for suffix in _DB_SUFFIXES:
            src = home.database.with_name(home.database.name + suffix)
            if src.exists():
                src.replace(partial / src.name)
        for secret in (home.ca_key.parent, runtime.cluster_key_path(home).parent):
            shutil.rmtree(secret, ignore_errors=True)
        os.replace(partial, final)
    journal_path(home).unlink(missing_ok=True)
    # The first record of this node's own (new) audit chain says where the old one rests.
    store = AuthorityStore(home.database)
    try:
        store.append_audit(
            "node",
            "node.authority.retire",
            "ok",
            target=f"cluster sha256:{journal['cluster']}",
            detail=f"the former main's authority database and CA certificate are kept "
            f"at {final}; its CA key and release key are deleted",
        )
    finally:
        store.close()
    return final
