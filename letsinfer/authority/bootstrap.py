"""Making a home into a main node: its identity, authority, default model and first key."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from letsinfer.audit.anchor import open_authority
from letsinfer.authority.apikeys import create_key
from letsinfer.authority.engine_keys import ensure_secret
from letsinfer.authority.models import FirstGroup, add_gguf_model
from letsinfer.config import Settings
from letsinfer.engines import releases
from letsinfer.engines.binary import BinaryError
from letsinfer.engines.tinymodel import DEFAULT_NAME, write_tiny_model
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity, load_identity, save_identity
from letsinfer.release import runtime
from letsinfer.store import StoreError
from letsinfer.trust.material import ensure_pairing_cert, init_main_pki, presented_fingerprint


def init_main(
    home: Home,
    settings: Settings,
    name: str | None = None,
    default_model: bool = True,
) -> tuple[NodeIdentity, str]:
    """Initialise the authority in one transaction; the identity file is written
    last, so an interrupted init leaves a home that a rerun initialises cleanly.
    Returns the identity and the first API key (its only showing)."""
    if load_identity(home.identity_file) is not None:
        raise StoreError(f"{home.etc} already belongs to a node")
    home.ensure()
    identity = NodeIdentity.new_main(name)
    cluster = init_main_pki(home, identity.node_id)
    runtime.ensure_cluster_key(home)
    identity = replace(identity, cluster=cluster, main_id=identity.node_id)
    store = open_authority(home)
    try:
        if store.list_nodes():
            raise StoreError(f"{home.database} already holds an authority")
        try:
            release = releases.for_engine_kind(
                settings.engine.kind, settings.engine.llama_server_binary
            )
        except BinaryError as exc:
            raise StoreError(f"cannot release the llama-server binary: {exc}") from exc
        with tempfile.TemporaryDirectory(dir=home.var) as tmp, store.transaction():
            store.add_node(
                identity.node_id, identity.name, "main", None, presented_fingerprint(home, identity)
            )
            ensure_secret(store)
            if default_model:
                signature = runtime.sign(home, release)
                path = write_tiny_model(Path(tmp) / "tiny.gguf")
                add_gguf_model(
                    store,
                    home.model_store,
                    DEFAULT_NAME,
                    path,
                    release=release,
                    place=lambda _: [FirstGroup(identity.node_id, release, signature)],
                    actor="up",
                    release_signature=signature,
                    known_good=True,  # generated here, same bytes every time
                )
            issued = create_key(store, "default", actor="up")
            store.append_audit("up", "node.init", "ok", role="main", target=identity.name)
        save_identity(home.identity_file, identity)
    finally:
        store.close()
    return identity, issued.secret


def init_candidate(home: Home, name: str | None = None) -> NodeIdentity:
    """A node waiting to be enrolled: its key and pairing certificate, no authority."""
    if load_identity(home.identity_file) is not None:
        raise StoreError(f"{home.etc} already belongs to a node")
    home.ensure()
    identity = NodeIdentity.new_candidate(name)
    ensure_pairing_cert(home, identity.node_id)
    store = open_authority(home)  # local audit chain of this node
    try:
        store.append_audit("cli", "node.init", "ok", role="candidate", target=identity.name)
    finally:
        store.close()
    save_identity(home.identity_file, identity)
    return identity
