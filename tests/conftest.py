from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from letsinfer.engines.tinymodel import write_tiny_model
from tests.admin_desk import desk, hub, main, running_desk  # noqa: F401 (fixtures: a main and a workstation)
from tests.lab.netns import ANSIBLE_SSH_ARGS
from tests.nodes import RunningNode, free_port, start_node

# No test reaches huggingface.co: every node (and huggingface_hub itself) that a
# test does not point at its own local hub is pointed at a closed local port.
for _name in ("LETSINFER_HUB__ENDPOINT", "HF_ENDPOINT"):
    os.environ.setdefault(_name, "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Playbooks the tests run reach lab hosts without SSH compression.
os.environ.setdefault("ANSIBLE_SSH_ARGS", ANSIBLE_SSH_ARGS)

# A CLI call a test makes without --home (`fleet apply`, a helper that forgot
# it) must never reach this machine's own node: after `./dev up` as root that
# is /etc/letsinfer, and a developer's LETSINFER_HOME may name theirs. Every
# such call gets an empty home of the test run's own. (Lab hosts are other
# machines: commands run there go through SSH or nsenter without this variable.)
_DEFAULT_HOME = tempfile.mkdtemp(prefix="letsinfer-tests-home-")
os.environ["LETSINFER_HOME"] = _DEFAULT_HOME
atexit.register(shutil.rmtree, _DEFAULT_HOME, True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reverse",
        action="store_true",
        help="run each module's tests in reverse order: every test must stand alone "
        "(a shared fixture is fine, state an earlier test left is not)",
    )


# The longest test files (docs/testing.md), longest first: under xdist they
# run first. The workers take whole files in collection order (`./dev test`:
# --dist loadfile --no-loadscope-reorder), and a long file taken last would
# leave the other worker idle at the end. (A fixed list, not the last run's
# build/test-times.tsv: both workers must collect the same order.)
LONGEST_FILES = (
    "tests/test_ansible_bundle.py",
    "tests/test_cluster_serving.py",
    "tests/test_ansible_onboarding.py",
    "tests/test_ansible_lab.py",
    "tests/test_trust.py",
    "tests/test_ansible_molecule.py",
    "tests/test_node_add_ssh.py",
    "tests/test_bundles.py",
)
TIMES = Path(__file__).resolve().parent.parent / "build" / "test-times.tsv"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reverse = config.getoption("--reverse")
    on_a_worker = hasattr(config, "workerinput")  # (xdist schedules from the workers' order)
    if not reverse and not on_a_worker:
        return
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = list(modules)
    if on_a_worker:  # the longest first, the rest in their order (a stable sort)
        rank = {path: i for i, path in enumerate(LONGEST_FILES)}
        ordered.sort(key=lambda path: rank.get(path, len(rank)))
    items[:] = [
        item for path in ordered for item in (reversed(modules[path]) if reverse else modules[path])
    ]


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # (under xdist the workers' reports arrive here, on the controller)
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Seconds per test file (setup, call and teardown summed; a module's shared
    cluster counts in its file): what to share or trim to keep CI short
    (docs/testing.md keeps the table). Also written to build/test-times.tsv."""
    if not _FILE_SECONDS:
        return
    ranked = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])
    TIMES.parent.mkdir(exist_ok=True)
    TIMES.write_text("".join(f"{seconds:.1f}\t{path}\n" for path, seconds in ranked))
    terminalreporter.section("seconds per test file (the 15 longest)")
    for path, seconds in ranked[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_line(f"{total:8.1f}  all {len(ranked)} files (summed over workers)")


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheelhouse lab hosts install letsinfer from: the one `./dev test`
    built (LETSINFER_LAB_WHEELHOUSE), else one built once for the session."""
    from tests.lab import wheelhouse

    given = os.environ.get("LETSINFER_LAB_WHEELHOUSE")
    if given and Path(given).is_file():
        return Path(given)
    return wheelhouse.build(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="module")
def main_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    """One main node on the embedded default, shared by a module's tests."""
    env = {
        "LETSINFER_GATEWAY__MAX_BODY_BYTES": "65536",
        "LETSINFER_GATEWAY__METRICS_PORT": str(free_port()),  # on loopback
    }
    node = start_node(tmp_path_factory.mktemp("main") / "home", env=env)
    try:
        yield node
    finally:
        node.stop()
