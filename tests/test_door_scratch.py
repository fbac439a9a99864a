"""The proof at the door (letsinfer/lifecycle/door.py) keeps its trial
engine's files in the folder it is given, and leaves nothing there."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from letsinfer.engines.binary import sha256_of
from letsinfer.engines.releases import LLAMA_SERVER_ARTIFACT, Release
from letsinfer.lifecycle.door import Door, DoorRefused, prove_model_file


def release_of(binary: Path) -> Release:
    return Release(
        id="door-test",
        engine="llama-server",
        version="0",
        target="cpu",
        artifacts={LLAMA_SERVER_ARTIFACT: sha256_of(binary)},
        launch={"binary": str(binary)},
    )


def test_the_trial_engine_s_files_go_to_the_scratch_folder_and_are_removed(
    tmp_path: Path,
) -> None:
    # An engine that notes the key file it was given, then fails to start.
    said = tmp_path / "argv"
    binary = tmp_path / "llama-server"
    binary.write_text(f'#!/bin/sh\necho "$@" > {said}\nexit 3\n')
    binary.chmod(0o755)
    scratch = tmp_path / "run"
    temp_before = set(Path(tempfile.gettempdir()).glob("letsinfer-door-*"))
    with pytest.raises(DoorRefused, match="exited with code 3"):
        prove_model_file(
            release_of(binary), tmp_path / "m.gguf", "completion", Door(scratch=scratch)
        )
    key_file = Path(said.read_text().split("--api-key-file ")[1].split()[0])
    assert key_file.parent.parent == scratch and key_file.parent.name.startswith("letsinfer-door-")
    assert list(scratch.iterdir()) == []  # the trial's folder is gone
    assert set(Path(tempfile.gettempdir()).glob("letsinfer-door-*")) == temp_before
