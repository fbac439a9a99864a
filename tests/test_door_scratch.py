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
    scratch = tmp_path / "store"  # as the model store's folder, which staging made
    scratch.mkdir()
    temp_before = set(Path(tempfile.gettempdir()).glob("letsinfer-door-*"))
    with pytest.raises(DoorRefused, match="exited with code 3"):
        prove_model_file(
            release_of(binary),
            tmp_path / "m.gguf",
            "completion",
            Door(scratch=scratch, scratch_prefix=".import-1-door-"),
        )
    key_file = Path(said.read_text().split("--api-key-file ")[1].split()[0])
    trial = key_file.parent
    assert trial.parent == scratch and trial.name.startswith(".import-1-door-")
    assert trial.name.endswith(".part")  # named as the store's partial imports
    assert list(scratch.iterdir()) == []  # the trial's folder is gone
    assert set(Path(tempfile.gettempdir()).glob("letsinfer-door-*")) == temp_before
