"""Wheelhouses for lab hosts, which have no network: built once on the root
namespace (the checkout plus its dependencies from the index), then handed to
Ansible as one tar archive (``node_wheelhouse``)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        check=True,
    )


def _tar(folder: Path, dest: Path) -> Path:
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for wheel in sorted(folder.glob("*.whl")):
            tar.add(wheel, arcname=wheel.name)
    tmp.replace(dest)
    return dest


def build(dest: Path, source: Path = ROOT) -> Path:
    """``dest``/wheelhouse.tar holding letsinfer from ``source`` and every dependency."""
    wheels = dest / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    _pip("wheel", str(source), "-w", str(wheels))
    return _tar(wheels, dest / "wheelhouse.tar")


def variant_source(dest: Path, version: str, broken: bool = False, source: Path = ROOT) -> Path:
    """A copy of ``source`` (``dest``/src) that says it is letsinfer ``version``;
    ``broken``: its ``letsinfer up`` fails at start (an upgrade that must roll back)."""
    tree = dest / "src"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(
        source,
        tree,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*cache", "molecule"
        ),
    )
    pyproject = tree / "pyproject.toml"
    text = re.sub(r'(?m)^version = ".*"$', f'version = "{version}"', pyproject.read_text())
    pyproject.write_text(text)
    init = tree / "letsinfer" / "__init__.py"
    init.write_text(re.sub(r'__version__ = ".*"', f'__version__ = "{version}"', init.read_text()))
    if broken:
        node = tree / "letsinfer" / "node.py"
        node.write_text(
            node.read_text() + '\nraise RuntimeError("a deliberately broken build of letsinfer")\n'
        )
    return tree


def build_variant(dest: Path, version: str, broken: bool, source: Path = ROOT) -> Path:
    """A wheelhouse holding only letsinfer ``version`` built from a copy of
    ``source`` (see variant_source); the hosts already have its dependencies."""
    tree = variant_source(dest, version, broken, source)
    wheels = dest / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    _pip("wheel", "--no-deps", str(tree), "-w", str(wheels))
    return _tar(wheels, dest / "wheelhouse.tar")


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "lab"))
