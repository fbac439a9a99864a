"""The node role installs only signed wheels where a release key is trusted.

Runs the role's release tasks on this machine (connection local, a scratch
install root) from a wheelhouse folder like the one the bundle role unpacks:
a genuine one installs, and the attacker's edits after signing (a rewritten
wheel, an extra wheel, a list re-signed by another key) stop the play with
the reason before pip installs anything. Needs root, like the role.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from letsinfer.bundle.wheelpins import LISTING_SIGNATURE
from letsinfer.release.keys import generate
from tests.nodes import letsinfer
from tests.test_wheelhouse_signing import make_wheel

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
VERSION = "9.9.9"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the node role installs as root"),
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    folder = tmp_path_factory.mktemp("keys")
    return {name: (folder / name, generate(folder / name).text) for name in ("site", "mallory")}


@pytest.fixture
def wheelhouse(tmp_path: Path, keys: dict[str, tuple[Path, str]]) -> Path:
    """A stand-in letsinfer wheel and a dependency, signed by the site's key."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    make_wheel(folder, "letsinfer", VERSION, "GENUINE = True\n", "probe_dep")
    make_wheel(folder, "probe_dep", "2.0", "DEP = True\n")
    signed = letsinfer(
        tmp_path / "signer", "wheelhouse", "sign", str(folder), "--key", str(keys["site"][0])
    )
    assert signed.returncode == 0, signed.stderr
    return folder


def install(tmp_path: Path, wheelhouse: Path, trusted: str) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "play.yml"
    play.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.include_role": {
                                "name": "letsinfer.cluster.node",
                                "tasks_from": "release.yml",
                            }
                        }
                    ],
                }
            ]
        )
    )
    settings = {
        "node_version": VERSION,
        "node_root": str(tmp_path / "opt"),
        "node_python": sys.executable,
        "node_find_links": str(wheelhouse),
        "node_release_trusted_keys": [trusted],
    }
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(settings))
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            *("-i", "localhost,", "-c", "local", str(play), "-e", f"@{extra}"),
            *("-e", f"ansible_python_interpreter={sys.executable}"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
        stdin=subprocess.DEVNULL,
        timeout=300,
    )


def installed(tmp_path: Path) -> list[str]:
    site = tmp_path / "opt" / "releases" / VERSION / "lib"
    found = sorted(p.name for p in site.glob("python*/site-packages/*.dist-info"))
    return [d for d in found if not d.startswith(("pip-", "setuptools-"))]  # the venv's own


def test_signed_wheels_install_with_their_hashes(
    tmp_path: Path, wheelhouse: Path, keys: dict[str, tuple[Path, str]]
) -> None:
    result = install(tmp_path, wheelhouse, keys["site"][1])
    assert result.returncode == 0, result.stdout[-4000:]
    assert installed(tmp_path) == [f"letsinfer-{VERSION}.dist-info", "probe_dep-2.0.dist-info"]
    requirements = (tmp_path / "opt" / "releases" / f"{VERSION}.requirements.txt").read_text()
    assert all("--hash=sha256:" in line for line in requirements.splitlines())


def rewrite_a_wheel(wheelhouse: Path, tmp_path: Path) -> str:
    evil = make_wheel(tmp_path, "probe_dep", "2.0", "import os  # evil\n")
    shutil.copy(evil, wheelhouse / evil.name)
    return f"wheel {evil.name} in {wheelhouse} does not match the signed list"


def slip_a_wheel_in(wheelhouse: Path, tmp_path: Path) -> str:
    extra = make_wheel(wheelhouse, "probe_dep", "9.0", "import os  # evil\n")
    return f"wheel {extra.name} in {wheelhouse} is not in the signed list"


@pytest.mark.parametrize("tamper", [rewrite_a_wheel, slip_a_wheel_in])
def test_a_wheelhouse_changed_after_signing_installs_nothing(
    tmp_path: Path, wheelhouse: Path, keys: dict[str, tuple[Path, str]], tamper
) -> None:
    message = tamper(wheelhouse, tmp_path)
    result = install(tmp_path, wheelhouse, keys["site"][1])
    assert result.returncode != 0
    said = " ".join(result.stdout.split())  # the YAML callback wraps long messages
    assert message in said, result.stdout[-3000:]
    assert "nothing was installed" in said
    assert installed(tmp_path) == []


def test_a_list_signed_by_an_untrusted_key_installs_nothing(
    tmp_path: Path, wheelhouse: Path, keys: dict[str, tuple[Path, str]]
) -> None:
    # The attacker adds their wheel and re-signs the list with their own key.
    make_wheel(wheelhouse, "evil", "1.0", "import os\n")
    resigned = letsinfer(
        tmp_path / "mallory",
        "wheelhouse",
        "sign",
        str(wheelhouse),
        "--key",
        str(keys["mallory"][0]),
    )
    assert resigned.returncode == 0, resigned.stderr
    result = install(tmp_path, wheelhouse, keys["site"][1])
    assert result.returncode != 0
    said = " ".join(result.stdout.split())
    assert "Refused to install letsinfer on localhost, nothing was installed" in said
    assert "which this node does not trust" in said
    assert installed(tmp_path) == []


def test_an_unsigned_list_installs_nothing(
    tmp_path: Path, wheelhouse: Path, keys: dict[str, tuple[Path, str]]
) -> None:
    (wheelhouse / LISTING_SIGNATURE).unlink()
    result = install(tmp_path, wheelhouse, keys["site"][1])
    assert result.returncode != 0
    assert "is unsigned, and this node trusts release keys" in " ".join(result.stdout.split())
    assert installed(tmp_path) == []
