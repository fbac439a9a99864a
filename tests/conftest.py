from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from letsinfer.engines.tinymodel import write_tiny_model
from tests.nodes import RunningNode, free_port, start_node

# No test reaches huggingface.co: every node (and huggingface_hub itself) that a
# test does not point at its own local hub is pointed at a closed local port.
for _name in ("LETSINFER_HUB__ENDPOINT", "HF_ENDPOINT"):
    os.environ.setdefault(_name, "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


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
