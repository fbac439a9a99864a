"""Developer tasks (invoke). Each is also a plain command, shown in README.md."""

from __future__ import annotations

import shutil
import sys

from invoke import Context, Exit, task

PY = sys.executable
# Debian packages the tests need (later issues add ssh, nftables, ...).
# nginx: the gateway benchmark's baseline (its short mode runs in the tests).
TEST_SYSTEM_PACKAGES: list[str] = ["nginx"]


@task
def system_packages(c: Context) -> None:
    """Install the Debian packages the test suite needs (as root, when missing)."""
    # Some binaries live in /usr/sbin, which a non-root PATH may lack.
    missing = [
        p
        for p in TEST_SYSTEM_PACKAGES
        if shutil.which(p) is None and shutil.which(p, path="/usr/sbin:/sbin") is None
    ]
    if not missing:
        return
    c.run("apt-get update -qq", hide="out")
    c.run("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq " + " ".join(missing))


@task
def lint(c: Context) -> None:
    """ruff check and ruff format --check."""
    c.run(f"{PY} -m ruff check .")
    c.run(f"{PY} -m ruff format --check .")


@task(pre=[system_packages, lint], help={"k": "only tests matching this expression"})
def test(c: Context, k: str = "") -> None:
    """The whole test suite (what .ci/run runs)."""
    selector = f" -k '{k}'" if k else ""
    result = c.run(f"{PY} -m pytest{selector}", warn=True, pty=False)
    assert result is not None
    if result.exited == 5:  # pytest: nothing collected
        print("no tests were collected", file=sys.stderr)
        raise Exit(code=1)
    if result.exited:
        raise Exit(code=result.exited)


@task(
    help={
        "short": "small counts (what the test suite runs)",
        "prefix": "also the shared-prefix benchmark on two llama.cpp engines",
        "json": "write the gateway figures to this file too",
    }
)
def bench(c: Context, short: bool = False, prefix: bool = False, json: str = "") -> None:
    """The gateway benchmark (direct, nginx, LiteLLM, letsinfer); see docs/benchmarks.md."""
    flags = (" --short" if short else "") + (f" --json {json}" if json else "")
    c.run(f"{PY} -m benchmarks.gateway{flags}", pty=False)
    if prefix:
        c.run(f"{PY} -m benchmarks.prefix" + (" --short" if short else ""), pty=False)
