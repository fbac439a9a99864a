from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from letsinfer.engines.tinymodel import write_tiny_model
from tests.nodes import RunningNode, start_node


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="module")
def main_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    """One main node on the embedded default, shared by a module's tests."""
    node = start_node(
        tmp_path_factory.mktemp("main") / "home", env={"LETSINFER_GATEWAY__MAX_BODY_BYTES": "65536"}
    )
    try:
        yield node
    finally:
        node.stop()
