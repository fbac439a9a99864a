"""What goes into a bundle besides the wheelhouse: model files and runtime releases.

``--model`` takes a model service name (its file comes from this node's model
store), a path to a GGUF file, or ``NAME=PATH``. ``--runtime`` takes
``xllamacpp`` (or its release id ``llama.cpp-xllamacpp-VERSION-cpu``) or
``llama-server[:TARGET]=PATH`` for a llama-server binary.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

from letsinfer.authority.models import check_model_name
from letsinfer.authority.modelstore import check_gguf
from letsinfer.bundle.archive import BundleError
from letsinfer.contracts.artifacts import ModelFileError, artifact_path
from letsinfer.engines import package
from letsinfer.engines.binary import BinaryError
from letsinfer.home import Home
from letsinfer.store import AuthorityStore, StoreError

Kind = Literal["wheel", "model", "runtime"]
TARGETS = ("cpu", "cuda", "rocm", "metal")
_XLLAMACPP_ID = re.compile(r"llama\.cpp-xllamacpp-(?P<version>[^-/]+)-cpu")
_LLAMA_SERVER = re.compile(r"llama-server(?::(?P<target>[a-z]+))?=(?P<path>.+)")


@dataclass(frozen=True)
class BundledModel:
    name: str
    source: Path

    @property
    def path(self) -> str:
        # Model names may hold "/" and ":"; a file name may not.
        return "models/" + re.sub(r"[/:]", "_", self.name) + ".gguf"


@dataclass(frozen=True)
class RuntimeSpec:
    engine: Literal["xllamacpp", "llama-server"]
    version: str | None = None  # xllamacpp: None means the wheelhouse's (or this machine's)
    target: str = "cpu"
    binary: Path | None = None


@dataclass(frozen=True)
class BundledRuntime:
    id: str
    engine: str
    version: str
    target: str
    launch: dict[str, str]
    artifacts: dict[str, str] = field(default_factory=dict)  # artifact name -> bundle path


def xllamacpp_release_id(version: str) -> str:
    return f"llama.cpp-xllamacpp-{version}-cpu"


def resolve_model(spec: str, home: Home) -> BundledModel:
    name, sep, path_text = spec.partition("=")
    if sep:
        path = Path(path_text).expanduser()
    elif Path(spec).expanduser().is_file():
        path = Path(spec).expanduser()
        name = path.stem
    else:
        name, path = spec, _stored_model(spec, home)
    try:
        check_model_name(name)
    except StoreError as exc:
        raise BundleError(f"--model {spec}: {exc} (give one as NAME=PATH)") from exc
    try:
        check_gguf(path)
    except ModelFileError as exc:
        raise BundleError(f"--model {spec}: {exc}") from exc
    return BundledModel(name=name, source=path)


def _stored_model(name: str, home: Home) -> Path:
    if not home.database.is_file():
        raise BundleError(
            f"--model {name}: no such file, and {home.label} holds no models to look it up in"
        )
    store = AuthorityStore(home.database)
    try:
        service = store.resolve_service(name)
    finally:
        store.close()
    if service is None:
        raise BundleError(f"--model {name}: no such file, and no model service by that name")
    return artifact_path(home.model_store, service.artifact_digest)


def parse_runtime(spec: str) -> RuntimeSpec:
    if spec == "xllamacpp":
        return RuntimeSpec("xllamacpp")
    if m := _XLLAMACPP_ID.fullmatch(spec):
        return RuntimeSpec("xllamacpp", version=m["version"])
    if m := _LLAMA_SERVER.fullmatch(spec):
        target = m["target"] or "cpu"
        if target not in TARGETS:
            raise BundleError(f"--runtime {spec}: unknown target {target!r} ({', '.join(TARGETS)})")
        binary = Path(m["path"]).expanduser()
        if not binary.is_file():
            raise BundleError(f"--runtime {spec}: {binary}: no such file")
        return RuntimeSpec("llama-server", target=target, binary=binary)
    raise BundleError(
        f"--runtime {spec}: expected xllamacpp, llama.cpp-xllamacpp-VERSION-cpu, "
        "or llama-server[:TARGET]=PATH"
    )


def _wheel_version(wheel: str) -> str:
    return wheel.split("-")[1]


def resolve_runtime(
    spec: RuntimeSpec,
    wheelhouse: Mapping[str, tuple[str, Path]],
    download: Callable[[str], Path],
    add_file: Callable[[str, Path, Kind], None],
) -> BundledRuntime:
    """Turn a spec into a release whose artifacts are files of the bundle.

    ``wheelhouse`` maps wheel file names to their bundle paths and local files; ``download``
    fetches one requirement's wheel for the target; ``add_file`` adds a file.
    """
    if spec.engine == "llama-server":
        assert spec.binary is not None
        release_id = f"llama.cpp-llama-server-{spec.target}"
        path = f"runtimes/{release_id}/llama-server"
        add_file(path, spec.binary, "runtime")
        return BundledRuntime(
            id=release_id,
            engine="llama-server",
            version="local",
            target=spec.target,
            launch={"binary": "llama-server"},
            artifacts={"llama-server": path},
        )
    wanted = spec.version
    in_house = [
        name
        for name in wheelhouse
        if name.startswith("xllamacpp-") and (wanted is None or _wheel_version(name) == wanted)
    ]
    if in_house:
        wheel_name = in_house[0]
        path, wheel = wheelhouse[wheel_name]
    else:
        version = wanted or metadata.version("xllamacpp")
        wheel = download(f"xllamacpp=={version}")
        wheel_name = wheel.name
        path = f"runtimes/{xllamacpp_release_id(version)}/{wheel_name}"
        add_file(path, wheel, "runtime")
    version = _wheel_version(wheel_name)
    try:
        # The id the installed wheel's release has on a node (engines/releases.py).
        digest = package.wheel_digest(wheel)
    except BinaryError as exc:
        raise BundleError(f"--runtime xllamacpp: {exc}") from exc
    return BundledRuntime(
        id=f"{xllamacpp_release_id(version)}-{digest[:12]}",
        engine="xllamacpp",
        version=version,
        target="cpu",
        launch={"module": "letsinfer.engines.llamacpp_launcher"},
        artifacts={"wheel": path},
    )
