"""A bundle's runtimes become runtime releases where it is imported: the
llama-server binary is installed from the mirror and released by its bytes,
the xllamacpp wheel by its package's bytes, so an air-gapped main runs what
the bundle brought without a network."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from letsinfer.bundle import wheelhouse as wheelhouse_build
from letsinfer.bundle.creation import CreateRequest, create_bundle
from letsinfer.engines import package
from letsinfer.engines.releases import xllamacpp_release
from letsinfer.home import Home
from letsinfer.release.keys import generate
from tests.nodes import letsinfer
from tests.test_bundles import make_main


@pytest.fixture(scope="module")
def site_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("keys")
    return folder / "site", generate(folder / "site").text


def release_list(home: Path) -> dict[str, dict]:
    listed = letsinfer(home, "release", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {r["id"]: r for r in json.loads(listed.stdout)}


def test_importing_a_bundle_installs_and_releases_its_llama_server(
    tmp_path: Path, site_key: tuple[Path, str]
) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'version: 4242 (bundled)'\n")
    binary.chmod(0o755)
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    bundle = tmp_path / "rt.tar"
    made = letsinfer(
        tmp_path / "builder",
        *("bundle", "create", "--out", str(bundle), "--key", str(site_key[0])),
        *("--no-wheels", "--runtime", f"llama-server:cuda={binary}"),
    )
    assert made.returncode == 0, made.stderr
    home = make_main(tmp_path / "main", site_key[1]).etc.parent
    before = set(release_list(home))

    imported = letsinfer(home, "bundle", "import", str(bundle), "--json")
    assert imported.returncode == 0, imported.stderr
    [release_id] = json.loads(imported.stdout)["registered"]
    [release] = [r for i, r in release_list(home).items() if i not in before]
    assert release["id"] == release_id
    assert (release["engine"], release["target"], release["sha256"]) == (
        "llama-server",
        "cuda",
        digest,
    )
    installed = Path(release["binary"])
    assert installed == home / "var" / "runtimes" / digest / "llama-server"
    assert installed.read_bytes() == binary.read_bytes()
    assert installed.stat().st_mode & stat.S_IXUSR
    assert "version: 4242 (bundled)" in release["version"]

    again = letsinfer(home, "bundle", "import", str(bundle), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["registered"] == []
    assert set(release_list(home)) == before | {release_id}


def fake_xllamacpp_wheel(folder: Path) -> Path:
    wheel = folder / "xllamacpp-7.7-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("xllamacpp/__init__.py", "")
        zf.writestr("xllamacpp/xllamacpp.abi3.so", b"\x7fELF bundled build")
        zf.writestr("xllamacpp-7.7.dist-info/METADATA", "Name: xllamacpp\nVersion: 7.7\n")
    return wheel


def test_importing_a_bundle_releases_its_xllamacpp_by_the_wheels_bytes(
    tmp_path: Path, site_key: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = fake_xllamacpp_wheel(tmp_path)

    def download(requirements: list[str], dest: Path, *target: object, **kw: object) -> list[Path]:
        assert requirements == ["xllamacpp==7.7"]
        dest.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copy(wheel, dest))]

    monkeypatch.setattr(wheelhouse_build, "download_wheels", download)
    bundle = tmp_path / "x.tar"
    request = CreateRequest(
        out=bundle, key=site_key[0], runtimes=["llama.cpp-xllamacpp-7.7-cpu"], wheels=False
    )
    created = create_bundle(Home.under(tmp_path / "builder"), request)
    expected = xllamacpp_release("7.7", package.wheel_digest(wheel))
    assert [r.id for r in created.manifest.runtimes] == [expected.id]

    home = make_main(tmp_path / "main", site_key[1]).etc.parent
    imported = letsinfer(home, "bundle", "import", str(bundle), "--json")
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["registered"] == [expected.id]
    release = release_list(home)[expected.id]
    assert (release["engine"], release["version"], release["signed"]) == ("xllamacpp", "7.7", True)
