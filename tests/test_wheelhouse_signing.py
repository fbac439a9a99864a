"""Signed wheelhouses as an attacker meets them: a node that trusts a release key
installs only the wheels a trusted list names, by their signed bytes.

The attacker rewrites a wheel after signing, slips an extra one in, drops or
forges the list's signature, or edits the list: each is refused with a message
naming what, and pip, given the list's requirements, installs nothing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from letsinfer.bundle import wheelhouse as wheelhouse_build
from letsinfer.bundle.creation import CreateRequest, create_bundle
from letsinfer.bundle.wheelpins import LISTING_NAME, LISTING_SIGNATURE
from letsinfer.home import Home
from letsinfer.release.keys import generate, load_private
from letsinfer.release.signatures import sign_bytes
from tests.nodes import letsinfer


def make_wheel(folder: Path, name: str, version: str, body: str, *requires: str) -> Path:
    """A minimal pure-Python wheel pip installs (one module, with its RECORD)."""
    dist = f"{name}-{version}"
    needs = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{name}.py": body.encode(),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{needs}"
        ).encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """ "site" (the node trusts it) and "mallory" (it does not)."""
    folder = tmp_path_factory.mktemp("keys")
    return {name: (folder / name, generate(folder / name).text) for name in ("site", "mallory")}


@pytest.fixture
def wheelhouse(tmp_path: Path, keys: dict[str, tuple[Path, str]]) -> Path:
    """A folder of two wheels, signed by the site's key with `letsinfer wheelhouse sign`."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    make_wheel(folder, "letsinfer_probe", "1.0", "GOOD = True\n", "probe_dep")
    make_wheel(folder, "probe_dep", "2.0", "DEP = True\n")
    signed = letsinfer(
        tmp_path / "signer", "wheelhouse", "sign", str(folder), "--key", str(keys["site"][0])
    )
    assert signed.returncode == 0, signed.stderr
    return folder


def verify(path: Path, key: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return letsinfer(path.parent / "node", "wheelhouse", "verify", str(path), "--key", key, *extra)


def pip_install(
    wheelhouse: Path, requirements: str, target: Path
) -> subprocess.CompletedProcess[str]:
    """What the node role runs: only the pinned wheels, from the folder, by hash."""
    req = target.parent / "requirements.txt"
    req.write_text(requirements)
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    target_args = ["--target", str(target), "-r", str(req)]
    return subprocess.run(
        [*pip, "--require-hashes", "--no-index", "--find-links", str(wheelhouse), *target_args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"},
    )


def test_a_signed_wheelhouse_verifies_and_its_requirements_install_every_wheel_by_hash(
    wheelhouse: Path, keys: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    result = verify(wheelhouse, keys["site"][1], "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [w["file"] for w in doc["wheels"]] == sorted(p.name for p in wheelhouse.glob("*.whl"))
    lines = doc["requirements"].splitlines()
    assert lines[0].startswith("letsinfer_probe==1.0 --hash=sha256:")
    assert all(" --hash=sha256:" in line for line in lines)

    installed = pip_install(wheelhouse, doc["requirements"], tmp_path / "site-packages")
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / "site-packages" / "letsinfer_probe.py").read_text() == "GOOD = True\n"


def test_a_wheel_rewritten_after_signing_is_refused_and_pip_installs_nothing(
    wheelhouse: Path, keys: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    requirements = json.loads(verify(wheelhouse, keys["site"][1], "--json").stdout)["requirements"]
    # The attacker rebuilds the wheel with their own code, same name and version.
    evil = make_wheel(tmp_path, "probe_dep", "2.0", "import os  # evil\n")
    shutil.copy(evil, wheelhouse / evil.name)

    result = verify(wheelhouse, keys["site"][1])
    assert result.returncode == 1
    assert f"wheel {evil.name} in {wheelhouse} does not match the signed list" in result.stderr
    assert "changed after signing" in result.stderr

    # Even with requirements taken before the swap, pip refuses it and installs nothing.
    target = tmp_path / "site-packages"
    installed = pip_install(wheelhouse, requirements, target)
    assert installed.returncode != 0
    assert "DO NOT MATCH THE HASHES" in installed.stderr
    assert not target.exists() or not any(target.iterdir())


def test_a_wheel_slipped_in_after_signing_is_refused(
    wheelhouse: Path, keys: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    # A newer version that plain `pip install --find-links` would prefer.
    extra = make_wheel(wheelhouse, "probe_dep", "9.0", "import os  # evil\n")
    result = verify(wheelhouse, keys["site"][1])
    assert result.returncode == 1
    assert f"wheel {extra.name} in {wheelhouse} is not in the signed list" in result.stderr

    requirements = (  # the genuine list still pins 2.0: pip never takes 9.0
        json.loads(verify(wheelhouse, keys["site"][1], "--listing-only", "--json").stdout)[
            "requirements"
        ]
    )
    target = tmp_path / "site-packages"
    assert pip_install(wheelhouse, requirements, target).returncode == 0
    assert not list(target.glob("probe_dep-9.0*"))
    assert list(target.glob("probe_dep-2.0.dist-info"))


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ("unsigned", "is unsigned, and this node trusts release keys"),
        ("resigned_by_mallory", "which this node does not trust"),
        ("listing_edited", "it was changed after signing"),
        ("no_listing", "has no signed wheel list (wheels.json)"),
    ],
)
def test_a_missing_untrusted_or_altered_list_is_refused(
    wheelhouse: Path, keys: dict[str, tuple[Path, str]], tamper: str, message: str
) -> None:
    listing, signature = wheelhouse / LISTING_NAME, wheelhouse / LISTING_SIGNATURE
    if tamper == "unsigned":
        signature.unlink()
    elif tamper == "resigned_by_mallory":
        mallory = load_private(keys["mallory"][0])
        signature.write_bytes(sign_bytes(listing.read_bytes(), mallory).to_json())
    elif tamper == "listing_edited":
        # The attacker adds their own wheel to the list and keeps the old signature.
        evil = make_wheel(wheelhouse, "evil", "1.0", "import os\n")
        doc = json.loads(listing.read_text())
        digest = hashlib.sha256(evil.read_bytes()).hexdigest()
        doc["wheels"].append(
            {"file": evil.name, "name": "evil", "version": "1.0", "sha256": digest}
        )
        listing.write_text(json.dumps(doc))
    else:
        listing.unlink()
        signature.unlink()
    for args in ((), ("--listing-only",)):
        result = verify(wheelhouse, keys["site"][1], *args)
        assert result.returncode == 1, args
        assert message in result.stderr, (args, result.stderr)
        assert result.stdout == ""  # no requirements to install from


def tar_of(folder: Path, dest: Path, extra: dict[str, bytes] | None = None) -> Path:
    with tarfile.open(dest, "w") as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def test_a_tar_of_wheels_is_checked_like_a_folder(
    wheelhouse: Path, keys: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    good = tar_of(wheelhouse, tmp_path / "good.tar")
    result = verify(good, keys["site"][1], "--json")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["wheels"]) == 2

    slipped = tar_of(wheelhouse, tmp_path / "slipped.tar", {"evil-1.0-py3-none-any.whl": b"PK"})
    result = verify(slipped, keys["site"][1])
    assert result.returncode == 1
    assert "wheel evil-1.0-py3-none-any.whl in" in result.stderr
    assert "is not in the signed list" in result.stderr

    name = next(wheelhouse.glob("probe_dep-*.whl")).name
    rewritten = tmp_path / "rewritten"
    shutil.copytree(wheelhouse, rewritten)
    (rewritten / name).write_bytes((rewritten / name).read_bytes() + b"\0")
    result = verify(tar_of(rewritten, tmp_path / "rewritten.tar"), keys["site"][1])
    assert result.returncode == 1
    assert f"wheel {name} in" in result.stderr
    assert "does not match the signed list" in result.stderr


def test_a_bundles_wheelhouse_carries_its_signed_list(
    tmp_path: Path, keys: dict[str, tuple[Path, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the bundle role unpacks on a host is checkable on its own."""
    made = tmp_path / "made"
    made.mkdir()
    built = make_wheel(made, "letsinfer", "9.9.9", "GENUINE = True\n", "probe_dep")
    dep = make_wheel(made, "probe_dep", "2.0", "DEP = True\n")

    def download(requirements: list[str], dest: Path, *target: object) -> list[Path]:
        dest.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copy(w, dest)) for w in (built, dep)]

    monkeypatch.setattr(wheelhouse_build, "find_source_tree", lambda explicit: tmp_path)
    monkeypatch.setattr(wheelhouse_build, "build_letsinfer_wheel", lambda source, work: built)
    monkeypatch.setattr(wheelhouse_build, "download_wheels", download)
    out = tmp_path / "site.tar"
    create_bundle(Home.under(tmp_path / "builder"), CreateRequest(out=out, key=keys["site"][0]))

    unpacked = tmp_path / "host"
    with tarfile.open(out) as tar:
        tar.extractall(unpacked, filter="data")
    result = verify(unpacked / "wheelhouse", keys["site"][1], "--json")
    assert result.returncode == 0, result.stderr
    assert [w["file"] for w in json.loads(result.stdout)["wheels"]] == [built.name, dep.name]
