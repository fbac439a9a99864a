"""Runtime releases run only under a trusted signature."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from letsinfer.engines.releases import llama_server, xllamacpp_cpu
from letsinfer.home import Home
from letsinfer.release import keys, runtime
from letsinfer.release.signatures import TrustError
from letsinfer.store import AuthorityStore
from tests.nodes import RunningNode


def test_release_signatures_are_checked(tmp_path: Path) -> None:
    home = Home.under(tmp_path / "main")
    mine = runtime.ensure_cluster_key(home)
    release = xllamacpp_cpu()
    sig = runtime.sign(home, release)
    assert runtime.verify(release, sig, [mine]) == mine

    with pytest.raises(TrustError, match="unsigned"):
        runtime.verify(release, None, [mine])
    other = keys.generate(tmp_path / "other.key")
    with pytest.raises(TrustError, match="does not trust"):
        runtime.verify(release, sig, [other])
    tampered = replace(release, launch={"module": "evil.module"})
    with pytest.raises(TrustError, match="changed after signing"):
        runtime.verify(tampered, sig, [mine])
    # Another binary path is another release, not the same id with new meaning.
    assert llama_server("/a/llama-server").id != llama_server("/b/llama-server").id


def test_the_node_refuses_to_run_an_unsigned_release(main_node: RunningNode) -> None:
    store = AuthorityStore(main_node.home / "var" / "authority.db")
    try:
        tiny = store.get_service("tiny")
        assert tiny is not None
        main_id = json.loads((main_node.home / "etc" / "node.json").read_text())["node_id"]
        store.ensure_release(
            "unsigned-llama",
            "xllamacpp",
            "1",
            "cpu",
            {},
            {"module": "letsinfer.engines.llamacpp_launcher"},
        )
        store.add_service("unsigned-model", tiny.artifact_digest, tiny.artifact_size, "gguf", None)
        pg = store.add_placement_group(
            "pg-unsigned", "unsigned-model", main_id, "unsigned-llama", "cpu"
        )
    finally:
        store.close()
    deadline = time.monotonic() + 20
    while True:
        shown = json.loads(main_node.cli("model", "show", "unsigned-model", "--json").stdout)
        [group] = shown[0]["placement_groups"]
        if group["state"] == "failed":
            break
        assert time.monotonic() < deadline, group
        time.sleep(0.3)
    assert "refused to run" in group["detail"] and "unsigned" in group["detail"]
    assert group["id"] == pg.id and group["pid"] is None
