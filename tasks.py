"""Developer tasks (invoke). Each is also a plain command, shown in README.md."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from invoke import Context, Exit, task

PY = sys.executable
BIN = Path(PY).parent
ROOT = Path(__file__).resolve().parent
COLLECTION = ROOT / "collections" / "ansible_collections" / "letsinfer" / "cluster"
BUILD = ROOT / "build"
# The man pages, written by `./dev man`; pyproject.toml ships them (share/man/man1).
MAN_PAGES = ROOT / "docs" / "man"
# Measured at 2 (CI's cores); the cap bounds the lab hosts and engines up at once.
MAX_TEST_WORKERS = 4
# Debian packages the tests need: the lab's hosts (sshd, nft, nc; ip and nsenter).
TEST_SYSTEM_PACKAGES: list[str] = [
    "openssh-server",
    "nftables",
    "netcat-openbsd",
    "iproute2",
    "util-linux",
    "curl",
    "nginx",  # the gateway benchmark's baseline (its short mode runs in the tests)
    "prometheus",  # promtool: checks and unit-tests the shipped alert rules
    "valgrind",  # callgrind counts the proxies' instructions (benchmarks/instructions.py)
    "man-db",  # man finds and shows the pages the node role links (tests/test_man_pages.py)
    # the portal's pages in a real browser, driven by Selenium (tests/test_portal_browser.py)
    "chromium",
    "chromium-driver",
]


def _installed(package: str) -> bool:
    probe = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
    )
    return probe.returncode == 0 and probe.stdout.strip() == "install ok installed"


def _env() -> dict[str, str]:
    """Tools from this venv first (molecule calls ansible-config, ansible-playbook)."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


# Where the test setup notes the host's enabled units before it installs
# anything; a test holds the host to that list afterwards (tests/test_units.py).
ENABLED_BEFORE = BUILD / "enabled-units-before-test-setup.txt"
# Debian's way to keep a package's maintainer scripts from starting services.
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


def enabled_units() -> set[str]:
    """Unit files enabled at boot on this host (systemd need not be running)."""
    if shutil.which("systemctl") is None:
        return set()
    listed = subprocess.run(
        ["systemctl", "list-unit-files", "--state=enabled", "--no-legend", "--plain"],
        capture_output=True,
        text=True,
    )
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


@task
def system_packages(c: Context) -> None:
    """Install the Debian packages the test suite needs (as root, when missing):
    no recommended extras, no service started, and any unit their install
    enabled is disabled again, so the host boots as it did."""
    if shutil.which("dpkg-query") is None:
        return
    before = enabled_units()
    BUILD.mkdir(exist_ok=True)
    if not ENABLED_BEFORE.exists():  # the first setup on this host saw it as it was
        ENABLED_BEFORE.write_text("".join(f"{u}\n" for u in sorted(before)))
    missing = [p for p in TEST_SYSTEM_PACKAGES if not _installed(p)]
    if not missing:
        return
    c.run("apt-get update -qq", hide="out")
    ours = not POLICY_RC_D.exists()
    if ours:
        POLICY_RC_D.write_text("#!/bin/sh\n# letsinfer's test setup: start no service\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        c.run(
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
            + " ".join(missing)
        )
    finally:
        if ours:
            POLICY_RC_D.unlink(missing_ok=True)
    enabled = sorted(enabled_units() - before)
    if enabled:
        c.run("systemctl disable --quiet " + " ".join(enabled), warn=True)
        print(f"test setup: disabled what the install enabled: {', '.join(enabled)}")


@task
def lint(c: Context) -> None:
    """ruff check and ruff format --check."""
    c.run(f"{PY} -m ruff check .")
    c.run(f"{PY} -m ruff format --check .")


@task
def openapi(c: Context) -> None:
    """Regenerate docs/admin-api.openapi.json from the admin API's routes."""
    c.run(f"{PY} -m letsinfer.control.ops.openapi", pty=False)


@task
def ansible_lint(c: Context) -> None:
    """ansible-lint (production profile) over playbooks, roles, collection, molecule."""
    c.run(f"{BIN}/ansible-lint --offline -q", env=_env())


@task
def collection(c: Context) -> None:
    """Build the letsinfer.cluster artifact into build/collection, roles copied in.

    The roles live once, in ./roles; the collection reaches them through a link
    that ansible-galaxy would skip, so the build works on a copy with the link
    replaced by the real directories."""
    out = BUILD / "collection"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "cluster"
        shutil.copytree(COLLECTION, staged, symlinks=False)  # follows the roles link
        c.run(
            f"{BIN}/ansible-galaxy collection build {staged} --output-path {out} --force",
            env=_env(),
            hide="out",
        )
    version = next(
        line.split(":", 1)[1].strip()
        for line in (COLLECTION / "galaxy.yml").read_text().splitlines()
        if line.startswith("version:")
    )
    artifact = out / f"letsinfer-cluster-{version}.tar.gz"
    with tarfile.open(artifact) as tar:
        names = set(tar.getnames())
    wanted = {f"roles/{r.name}/tasks/main.yml" for r in (ROOT / "roles").iterdir()}
    wanted |= {f"roles/{r.name}/meta/argument_specs.yml" for r in (ROOT / "roles").iterdir()}
    wanted.add("plugins/modules/letsinfer_node.py")
    missing = sorted(wanted - names)
    if missing:
        raise Exit(f"{artifact} lacks {', '.join(missing)}", code=1)
    print(f"built {artifact.relative_to(ROOT)} ({len(names)} entries, roles included)")


@task
def man(c: Context) -> None:
    """Rewrite docs/man/, the man pages, from the commands' current help.

    One page per command and group; the wheel ships them (share/man/man1)."""
    c.run(f"{PY} -m letsinfer.cli.man_pages {MAN_PAGES}", pty=False)


@task
def wheelhouse(c: Context) -> None:
    """Wheels of this checkout and its dependencies for the lab (build/lab/wheelhouse.tar)."""
    from tests.lab.wheelhouse import build

    print(build(BUILD / "lab"))


@task
def molecule(c: Context) -> None:
    """molecule test of the lab scenario, molecule/default (root; hosts are namespaces).
    `invoke test` runs it too, as tests/test_ansible_molecule.py."""
    from tests.lab.netns import ANSIBLE_SSH_ARGS, new_prefix

    wheels = BUILD / "lab" / "wheelhouse.tar"
    if not wheels.exists():
        wheelhouse(c)
    env = {
        "ANSIBLE_SSH_ARGS": ANSIBLE_SSH_ARGS,
        **_env(),
        "LETSINFER_LAB_PREFIX": new_prefix(),
        "LETSINFER_LAB_WHEELHOUSE": str(wheels),
    }
    c.run(f"{BIN}/molecule test", env=env)


@task(
    pre=[system_packages, lint, ansible_lint, collection],
    help={"k": "only tests matching this expression"},
)
def test(c: Context, k: str = "") -> None:
    """The whole test suite (what .ci/run runs), molecule's lab scenario included
    (tests/test_ansible_molecule.py: the workers share it with the other files)."""
    env = _env()
    if os.geteuid() == 0:
        wheelhouse(c)
        env["LETSINFER_LAB_WHEELHOUSE"] = str(BUILD / "lab" / "wheelhouse.tar")
    else:
        print("molecule's lab scenario and the lab tests need root: skipped", file=sys.stderr)
    selector = f" -k '{k}'" if k else ""
    # The tests start hundreds of nodes and thousands of CLI calls from this
    # checkout; where PYTHONDONTWRITEBYTECODE is set (this machine's image) each of
    # them would compile every letsinfer module it imports (test_cli.py: 16 %
    # less CPU with the bytecode written once, here).
    c.run(f"{PY} -m compileall -q -j 0 letsinfer tests", pty=False, env=env)
    # Much of the suite waits on servers, engines and lab hosts: one worker per
    # core left both cores idle about a tenth of the run, so there is one
    # worker more (docs/testing.md). A file's tests stay in one worker: its
    # module-scoped main nodes and labs are built once. Files are handed out
    # in collection order, the longest first (tests/conftest.py).
    workers = min(len(os.sched_getaffinity(0)) + 1, MAX_TEST_WORKERS)
    parallel = f" -n {workers} --dist loadfile --no-loadscope-reorder" if workers > 1 else ""
    result = c.run(f"{PY} -m pytest{parallel}{selector}", warn=True, pty=False, env=env)
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
        "before": "also measure the gateway of another letsinfer checkout (A/B)",
        "records": "also the request-records benchmark (their cost, the authority's writes)",
        "cli": "only the CLI's own timing: --help, status, ... against `python -c pass`",
        "zero_delay": "the proxy's own cost: every token at once (direct, nginx, letsinfer)",
        "instructions": "only the proxies' instructions per request, counted by valgrind",
        "scale": "only one main under simulated nodes: 100, 1,000, 3,000 (about 15 minutes)",
        "nodes": "with --scale: the sizes, comma-separated (e.g. 100,1000)",
        "capacity": "only capacity on demand: a cold model's first token, 6 models on 2 GPUs",
    }
)
def bench(
    c: Context,
    short: bool = False,
    prefix: bool = False,
    json: str = "",
    before: str = "",
    records: bool = False,
    scale: bool = False,
    nodes: str = "",
    cli: bool = False,
    zero_delay: bool = False,
    instructions: bool = False,
    capacity: bool = False,
) -> None:
    """The gateway benchmark (direct, nginx, LiteLLM, letsinfer); see docs/benchmarks.md."""
    if cli:
        c.run(f"{PY} -m benchmarks.cli" + (" --runs 3" if short else ""), pty=False)
        return
    if instructions:
        extra = (" --requests 200" if short else "") + (f" --before {before}" if before else "")
        extra += f" --json {json}" if json else ""
        c.run(f"{PY} -m benchmarks.instructions{extra}", pty=False)
        return
    if scale:
        sizes = f" --nodes {nodes}" if nodes else ""
        sizes += " --nodes 50,200 --warm 10 --measure 20" if short and not nodes else ""
        c.run(f"{PY} -m benchmarks.scale{sizes}", pty=False)
        return
    if capacity:
        extra = (" --short" if short else "") + (f" --json {json}" if json else "")
        c.run(f"{PY} -m benchmarks.capacity{extra}", pty=False)
        return
    flags = (" --short" if short else "") + (f" --json {json}" if json else "")
    flags += f" --before {before}" if before else ""
    flags += " --zero-delay" if zero_delay else ""
    c.run(f"{PY} -m benchmarks.gateway{flags}", pty=False)
    if records:
        c.run(f"{PY} -m benchmarks.records" + (" --short" if short else ""), pty=False)
    if prefix:
        c.run(f"{PY} -m benchmarks.prefix" + (" --short" if short else ""), pty=False)
