"""Runtime releases run only under a trusted signature."""

from __future__ import annotations

import hashlib
import json
import sys
import time
import zipfile
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest

from letsinfer.engines import package
from letsinfer.engines.binary import BinaryError, BinaryIdentity
from letsinfer.engines.releases import check_binary, for_engine_kind, llama_server, xllamacpp_cpu
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
    # Another binary path, or other bytes, is another release: never the same id
    # with new meaning.
    a = BinaryIdentity("/a/llama-server", "1" * 64, "version: 1")
    assert llama_server(a).id != llama_server(replace(a, path="/b/llama-server")).id
    assert llama_server(a).id != llama_server(replace(a, sha256="2" * 64)).id


def shim_binary(path: Path) -> Path:
    """The test shim as an executable file of its own (its bytes are the "binary")."""
    shim = Path(__file__).parent / "llama_server_shim.py"
    path.write_text(f"#!{sys.executable}\n" + shim.read_text())
    path.chmod(0o755)
    return path


def test_a_llama_server_release_is_bound_to_its_binarys_bytes(tmp_path: Path) -> None:
    binary = shim_binary(tmp_path / "llama-server")
    release = for_engine_kind("llama-server", str(binary), "cuda")
    assert release.artifacts == {"llama-server": hashlib.sha256(binary.read_bytes()).hexdigest()}
    assert release.launch == {"binary": str(binary)} and "version: 0 (shim)" in release.version
    check_binary(release)  # the released bytes: runs

    # The same path, other bytes: refused, naming the path and both digests.
    released = release.artifacts["llama-server"]
    with binary.open("a") as fh:
        fh.write("# rebuilt\n")
    now = hashlib.sha256(binary.read_bytes()).hexdigest()
    with pytest.raises(BinaryError) as refused:
        check_binary(release)
    said = str(refused.value)
    assert str(binary) in said and released in said and now in said
    assert "--replace-existing" in said
    # Released again: a new release of what is there now, which runs.
    again = for_engine_kind("llama-server", str(binary), "cuda")
    assert again.id != release.id and again.artifacts == {"llama-server": now}
    check_binary(again)

    # Gone, or a release that never recorded its bytes: refused too.
    legacy = replace(release, artifacts={})
    with pytest.raises(BinaryError, match="records no sha256"):
        check_binary(legacy)
    binary.unlink()
    with pytest.raises(BinaryError, match="no such file"):
        check_binary(again)
    with pytest.raises(BinaryError, match="not found on PATH"):
        for_engine_kind("llama-server", "no-such-llama-server-here")


def fake_package(site: Path, version: str, native: bytes) -> metadata.Distribution:
    """An installed stand-in for xllamacpp: a module, a "native" library, its dist-info."""
    files = {"xllamacpp/__init__.py": b"", "xllamacpp/xllamacpp.abi3.so": native}
    info = site / f"xllamacpp-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: xllamacpp\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    for name, data in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
    listed = [*files, f"{info.name}/METADATA", f"{info.name}/INSTALLER", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{name},,\n" for name in listed))
    return metadata.Distribution.at(info)


def test_an_xllamacpp_release_is_bound_to_its_installed_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dist = fake_package(tmp_path / "site", "1.0", b"\x7fELF genuine build")
    release = xllamacpp_cpu(dist)
    digest = release.artifacts["xllamacpp"]
    assert release.id == f"llama.cpp-xllamacpp-1.0-cpu-{digest[:12]}"
    check_binary(release, dist)  # the released bytes: runs

    # A wheel of the same files names the same release: what a bundle carries.
    wheel = tmp_path / "xllamacpp-1.0-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path in sorted((tmp_path / "site").rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(tmp_path / "site").as_posix())
    assert package.wheel_digest(wheel) == digest

    # Another build under the same version: refused, naming both digests.
    (tmp_path / "site" / "xllamacpp" / "xllamacpp.abi3.so").write_bytes(b"\x7fELF other build")
    with pytest.raises(BinaryError) as refused:
        check_binary(release, dist)
    said = str(refused.value)
    assert "changed since runtime release" in said and digest in said
    assert "--replace-existing" in said
    again = xllamacpp_cpu(dist)
    assert again.id != release.id and again.version == release.version
    check_binary(again, dist)
    # A release made before releases were bound to bytes still runs (an
    # upgrade of letsinfer must not stop every cluster's groups), said in the log.
    with caplog.at_level("WARNING", logger="letsinfer.engines"):
        check_binary(replace(again, artifacts={}, id="llama.cpp-xllamacpp-1.0-cpu"), dist)
    assert "records no digest of the xllamacpp package" in caplog.text


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
        [group] = shown["placement_groups"]
        if group["state"] == "failed":
            break
        assert time.monotonic() < deadline, group
        time.sleep(0.3)
    assert "refused to run" in group["detail"] and "unsigned" in group["detail"]
    assert group["id"] == pg.id and group["pid"] is None
