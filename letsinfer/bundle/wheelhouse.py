"""A wheelhouse for the target: letsinfer built from its source tree, and every
dependency as a binary wheel for the target's platform and Python (pip does
the resolving and downloading; nothing here reimplements it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

import letsinfer
from letsinfer.bundle.archive import BundleError

# What a build never needs from a working copy (and some of it is large).
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache"
)


def find_source_tree(explicit: Path | None) -> Path:
    tree = (explicit or Path(letsinfer.__file__).resolve().parent.parent).expanduser()
    try:
        project = tomllib.loads((tree / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    if project.get("name") != "letsinfer":
        raise BundleError(
            f"{tree} is not letsinfer's source tree (no pyproject.toml for letsinfer); "
            "pass --source DIR"
        )
    return tree


def _pip(args: Sequence[str], what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise BundleError(f"{what} failed (pip exited with {proc.returncode}):\n{tail}")


def build_letsinfer_wheel(source: Path, workdir: Path) -> Path:
    """Build from a clean copy, so the working tree gets no build/ litter."""
    copy = workdir / "source"
    shutil.copytree(source, copy, ignore=_NOT_SOURCE, symlinks=True)
    out = workdir / "built"
    _pip(["wheel", "--no-deps", "--wheel-dir", str(out), str(copy)], "building the letsinfer wheel")
    wheels = sorted(out.glob("letsinfer-*.whl"))
    if len(wheels) != 1:
        raise BundleError(f"building the letsinfer wheel produced {len(wheels)} wheels, not one")
    return wheels[0]


def _target_args(platforms: Sequence[str], python_version: str | None) -> list[str]:
    args = ["--only-binary=:all:"]
    for platform in platforms:
        args += ["--platform", platform]
    if python_version:
        args += ["--python-version", python_version]
    if platforms or python_version:
        args += ["--implementation", "cp"]
    return args


def download_wheels(
    requirements: Sequence[str],
    dest: Path,
    platforms: Sequence[str],
    python_version: str | None,
    *,
    with_deps: bool = True,
) -> list[Path]:
    """``pip download`` binary wheels for the target into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    args = ["download", "--dest", str(dest), *_target_args(platforms, python_version)]
    if not with_deps:
        args.append("--no-deps")
    _pip([*args, *requirements], f"downloading wheels for {' '.join(requirements)}")
    return sorted(dest.glob("*.whl"))
