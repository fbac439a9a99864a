"""Runtime releases built into this package: engine + version + target + launch.

A release is what a placement group runs. Its id is immutable: the same id
always means the same engine build.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any


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


def llama_server(binary: str, target: str = "cpu") -> Release:
    # The binary is part of what runs: another path is another release.
    tag = hashlib.sha256(binary.encode()).hexdigest()[:8]
    return Release(
        id=f"llama.cpp-llama-server-{target}-{tag}",
        engine="llama-server",
        version="local",
        target=target,
        launch={"binary": binary},
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


def for_engine_kind(kind: str, llama_server_binary: str) -> Release:
    if kind == "llama-server":
        return llama_server(llama_server_binary)
    return xllamacpp_cpu()
