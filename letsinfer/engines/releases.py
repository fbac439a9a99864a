"""Runtime releases built into this package: engine + version + target + launch.

A release is what a placement group runs. Its id is immutable: the same id
always means the same engine build.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from letsinfer.engines.binary import BinaryIdentity, check_bytes, identify


@dataclass(frozen=True)
class Release:
    id: str
    # "xllamacpp" (llama.cpp's server in-process), "llama-server" (binary): one
    # device; "vllm", "parallel-command": parallel runtimes (several tasks)
    engine: str
    version: str
    target: str  # cpu, cuda, rocm, metal
    artifacts: dict[str, str] = field(default_factory=dict)
    launch: dict[str, Any] = field(default_factory=dict)


def xllamacpp_cpu() -> Release:
    version = metadata.version("xllamacpp")
    return Release(
        id=f"llama.cpp-xllamacpp-{version}-cpu",
        engine="xllamacpp",
        version=version,
        target="cpu",
        launch={"module": "letsinfer.engines.llamacpp_launcher"},
    )


LLAMA_SERVER_ARTIFACT = "llama-server"  # a llama-server release's binary, by sha256


def llama_server(binary: BinaryIdentity, target: str = "cpu") -> Release:
    """A release of one binary, by its bytes (see engines/binary.py): another
    path or other bytes under the same path make another release."""
    tag = hashlib.sha256(f"{binary.path}\n{binary.sha256}".encode()).hexdigest()[:12]
    return Release(
        id=f"llama.cpp-llama-server-{target}-{tag}",
        engine="llama-server",
        version=binary.version,
        target=target,
        artifacts={LLAMA_SERVER_ARTIFACT: binary.sha256},
        launch={"binary": binary.path},
    )


def check_binary(release: Release) -> None:
    """Before a llama-server release starts: its binary must still be the
    released bytes (raises BinaryError saying which path and both digests)."""
    if release.engine == "llama-server":
        check_bytes(
            str(release.launch.get("binary", "")),
            release.artifacts.get(LLAMA_SERVER_ARTIFACT),
            f"runtime release {release.id}",
        )


PARALLEL_ENGINES = ("vllm", "parallel-command")


def is_parallel(release: Release) -> bool:
    """Whether the runtime itself spreads one model over several tasks."""
    return release.engine in PARALLEL_ENGINES


def parallel_command(binary: str, target: str = "cpu") -> Release:
    """A parallel runtime behind one launcher (see engines/parallel_command.py)."""
    tag = hashlib.sha256(binary.encode()).hexdigest()[:8]
    return Release(
        id=f"parallel-command-{target}-{tag}",
        engine="parallel-command",
        version="local",
        target=target,
        launch={"binary": binary},
    )


def for_engine_kind(kind: str, llama_server_binary: str, target: str = "cpu") -> Release:
    """The release for new placements of ``kind``. A llama-server binary is
    identified here, on the main (raises BinaryError when it cannot be)."""
    if kind == "llama-server":
        return llama_server(identify(llama_server_binary), target)
    return xllamacpp_cpu()
