"""The main and its agents share contracts (letsinfer/contracts/), not code:
a child's agent runs none of the main's authority."""

from __future__ import annotations

import json
import subprocess
import sys


def test_a_child_agent_loads_no_authority_code() -> None:
    probe = (
        "import json, sys, letsinfer.agent.runtime\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('letsinfer.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(out))
    # Its own audit chain, signed head and counted refusals are the node's
    # (letsinfer.audit), not the authority's.
    assert not {m for m in loaded if m.startswith("letsinfer.authority")}
    assert "letsinfer.audit.anchor" in loaded
    # Nor the main's planes: its control app, operations and gateway.
    assert not {m for m in loaded if m.startswith("letsinfer.gateway")}
    assert not loaded & {"letsinfer.control.app", "letsinfer.control.ops", "letsinfer.node"}
    # What it speaks with the main comes from the neutral module.
    assert {
        "letsinfer.contracts.facts",
        "letsinfer.contracts.placement",
        "letsinfer.contracts.artifacts",
    } <= loaded
