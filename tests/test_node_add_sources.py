"""Where `node add --ssh` installs letsinfer from on an air-gapped site: with
no --wheelhouse or --index-url, the wheelhouse of the newest bundle imported
into the main's mirror that holds the main's own version, packed as the flat
archive the node role unpacks."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from letsinfer.fleet.node_add import mirror_wheelhouse, packed


def bundle(bundles: Path, bundle_id: str, version: str, mtime: float) -> Path:
    wheelhouse = bundles / bundle_id / "wheelhouse"
    wheelhouse.mkdir(parents=True)
    (wheelhouse / f"letsinfer-{version}-py3-none-any.whl").write_bytes(b"wheel " + version.encode())
    (wheelhouse / "numpy-2.3.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"numpy")
    (wheelhouse / "wheels.json").write_text("{}")
    (wheelhouse / "wheels.json.sig").write_text("sig")
    os.utime(wheelhouse, (mtime, mtime))
    return wheelhouse


def test_the_newest_bundle_holding_the_main_s_version_is_chosen(tmp_path: Path) -> None:
    bundles = tmp_path / "mirror" / "bundles"
    assert mirror_wheelhouse(bundles, "0.1.0") is None  # no mirror yet: the index
    old = bundle(bundles, "b-old", "0.1.0", 1_000)
    newer = bundle(bundles, "b-new", "0.1.0", 2_000)
    bundle(bundles, "b-other", "0.2.0", 3_000)  # newest, but another version
    (bundles / "b-models-only").mkdir()  # a bundle made with --no-wheels
    assert mirror_wheelhouse(bundles, "0.1.0") == newer
    assert mirror_wheelhouse(bundles, "0.3.0") is None
    assert old != newer


def test_the_packed_wheelhouse_is_what_the_node_role_unpacks(tmp_path: Path) -> None:
    wheelhouse = bundle(tmp_path / "bundles", "b1", "0.1.0", 1_000)
    out = tmp_path / "out"
    out.mkdir()
    archive = packed(wheelhouse, out)
    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
    assert names == sorted(p.name for p in wheelhouse.iterdir())  # flat, the signed list too
    unpack = tmp_path / "unpack"
    unpack.mkdir()
    # The node role's own command for the doctor's wheel.
    subprocess.run(
        ["tar", "-xf", str(archive), "-C", str(unpack), "--wildcards", "letsinfer-0.1.0-*.whl"],
        check=True,
    )
    assert [p.name for p in unpack.iterdir()] == ["letsinfer-0.1.0-py3-none-any.whl"]
