"""molecule's lab scenario (molecule/default): destroy, syntax, create, prepare,
check, converge, idempotence, verify, destroy, on hosts that are network
namespaces. It runs as one test so that pytest's workers share it with the
rest of the suite instead of CI waiting for it before pytest starts (`invoke
molecule` runs the same scenario by hand). Needs root, like CI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.netns import new_prefix

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("sshd", "nft", "nc", "nsenter")),
        reason="the lab needs root, openssh-server, nftables, netcat-openbsd and util-linux",
    ),
    pytest.mark.timeout(1200),  # a converge, a second run and verify on a loaded 2-core machine
]


def test_molecule_s_lab_scenario_converges_idempotently_and_verifies(
    wheels: Path, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        # its state and inventory in the test's folder, not ~/.ansible/tmp
        "MOLECULE_EPHEMERAL_DIRECTORY": str(tmp_path / "molecule"),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",  # molecule calls ansible-config
        "LETSINFER_LAB_PREFIX": new_prefix(),
        "LETSINFER_LAB_WHEELHOUSE": str(wheels),
        "ANSIBLE_FORCE_COLOR": "0",
        "PY_COLORS": "0",
    }
    result = subprocess.run(
        [str(BIN / "molecule"), "test"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=1100,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-8000:]
