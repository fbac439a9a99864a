"""Runtime releases built into this package: engine + version + target + launch.

A release is what a placement group runs. Its id is immutable: the same id
always means the same engine build.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from letsinfer.engines.binary import BinaryError, BinaryIdentity, check_bytes, identify


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


XLLAMACPP_ARTIFACT = "xllamacpp"  # an xllamacpp release's installed package, by digest
_UNBOUND_SAID: set[str] = set()  # releases from before the binding, warned about once
log = logging.getLogger("letsinfer.engines")

if TYPE_CHECKING:
    from importlib import metadata


def xllamacpp_cpu(dist: metadata.Distribution | None = None) -> Release:
    """The release of the xllamacpp this letsinfer imports, by its installed bytes
    (see engines/package.py): another build of the same version is another release."""
    from letsinfer.engines import package  # importlib.metadata: not for every CLI call

    dist = dist or package.installed("xllamacpp")
    return xllamacpp_release(dist.version, package.distribution_digest(dist))


def xllamacpp_release(version: str, digest: str) -> Release:
    """The xllamacpp release of the package whose ``engines.package`` digest this is
    (installed here, or in a bundle's wheel)."""
    return Release(
        id=f"llama.cpp-xllamacpp-{version}-cpu-{digest[:12]}",
        engine="xllamacpp",
        version=version,
        target="cpu",
        artifacts={XLLAMACPP_ARTIFACT: digest},
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


def check_binary(release: Release, dist: metadata.Distribution | None = None) -> None:
    """Before a llama-server or xllamacpp release starts: its binary (or installed
    package, ``dist`` standing in for xllamacpp's) must still be the released bytes
    (raises BinaryError saying what and both digests)."""
    if release.engine == "llama-server":
        check_bytes(
            str(release.launch.get("binary", "")),
            release.artifacts.get(LLAMA_SERVER_ARTIFACT),
            f"runtime release {release.id}",
        )
    elif release.engine == "xllamacpp":
        from letsinfer.engines import package

        _check_package(release, dist or package.installed("xllamacpp"))


def _check_package(release: Release, dist: metadata.Distribution) -> None:
    again = (
        "Release it again: `letsinfer model install MODEL --node NODE --replace-existing` "
        "releases the installed package as it is now"
    )
    released = release.artifacts.get(XLLAMACPP_ARTIFACT)
    if not released:
        # Made before releases were bound to bytes: it runs as it always did
        # (an upgrade must not stop every cluster's groups), said once; a
        # release made now is bound.
        if release.id not in _UNBOUND_SAID:
            _UNBOUND_SAID.add(release.id)
            log.warning(
                "runtime release %s records no digest of the xllamacpp package (made before "
                "releases were bound to bytes): it runs unchecked. %s",
                release.id,
                again,
            )
        return
    from letsinfer.engines import package

    now = package.distribution_digest(dist)
    if now != released or dist.version != release.version:
        raise BinaryError(
            f"the installed xllamacpp {dist.version} changed since runtime release {release.id} "
            f"was made: released sha256:{released}, now sha256:{now}. {again}"
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
