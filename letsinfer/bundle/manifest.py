"""The bundle manifest: every file with its size and sha256, what it is, and for
which target. The exact bytes of ``manifest.json`` are what is signed."""

from __future__ import annotations

import json
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from letsinfer.bundle.paths import MANIFEST_NAME, SIGNATURE_NAME, path_problem

FORMAT: Final = "letsinfer-bundle/1"
SHA256 = r"^[0-9a-f]{64}$"


class ManifestError(Exception):
    """The manifest is not a well-formed bundle manifest."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BundleFile(_Part):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256)
    kind: Literal["wheel", "model", "runtime"]


class ModelSourceFile(_Part):
    name: str = Field(min_length=1, max_length=1024)  # its path in the repository
    path: str  # the file in the bundle (its sha256 is the one the hub published)


class ModelSource(_Part):
    """Where a model came from: a hub repository at one commit (``bundle create
    --model REPO@REV``), so that ``model pull`` finds it in a mirror."""

    repo: str = Field(min_length=1, max_length=200)
    revision: str = Field(min_length=1, max_length=200)  # as asked: a branch, tag or commit
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    files: tuple[ModelSourceFile, ...] = Field(min_length=1, max_length=256)  # split parts in order


class BundleModel(_Part):
    name: str
    path: str  # one of the manifest's files (a split model's first part)
    format: Literal["gguf"] = "gguf"
    source: ModelSource | None = None


class BundleRuntime(_Part):
    """A runtime release: its artifacts are named by digest, each one a listed file."""

    id: str
    engine: str
    version: str
    target: str
    artifacts: dict[str, str]
    launch: dict[str, str]


class Target(_Part):
    platforms: tuple[str, ...]  # pip platform tags; empty: the creating machine's own
    python_version: str
    built_on: str  # the creating machine's OS and architecture


class Manifest(_Part):
    format: Literal["letsinfer-bundle/1"] = FORMAT
    created_at: str
    created_by: str
    target: Target
    files: tuple[BundleFile, ...]
    models: tuple[BundleModel, ...] = ()
    runtimes: tuple[BundleRuntime, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        paths = set()
        for f in self.files:
            problem = path_problem(f.path)
            if problem is None and f.path in (MANIFEST_NAME, SIGNATURE_NAME):
                problem = "is reserved for the manifest"
            if problem:
                raise ValueError(f"file {f.path!r} {problem}")
            if f.path in paths:
                raise ValueError(f"file {f.path!r} is listed twice")
            paths.add(f.path)
        for path in paths:
            # A file cannot also be a folder of another file ("a" and "a/b").
            parent = path.rpartition("/")[0]
            while parent:
                if parent in paths:
                    raise ValueError(f"file {parent!r} is also a folder of {path!r}")
                parent = parent.rpartition("/")[0]
        digests = {f.sha256 for f in self.files}
        for m in self.models:
            if m.path not in paths:
                raise ValueError(f"model {m.name!r} names {m.path!r}, which is not a listed file")
            if m.source is not None:
                for sf in m.source.files:
                    if sf.path not in paths:
                        raise ValueError(
                            f"model {m.name!r} source file {sf.name!r} is not a listed file"
                        )
                if m.source.files[0].path != m.path:
                    raise ValueError(f"model {m.name!r}: its path is not its source's first file")
        for r in self.runtimes:
            for name, digest in r.artifacts.items():
                if digest not in digests:
                    raise ValueError(f"runtime {r.id!r} artifact {name!r} is not a listed file")
        return self

    def as_json(self) -> dict[str, Any]:
        """The manifest as JSON data; a model without a hub source has no ``source``
        key, so such a bundle reads exactly as before sources existed."""
        data = self.model_dump(mode="json")
        for model in data["models"]:
            if model.get("source") is None:
                model.pop("source", None)
        return data

    def to_bytes(self) -> bytes:
        return (json.dumps(self.as_json(), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "manifest"
            raise ManifestError(
                f"{MANIFEST_NAME} is not a valid bundle manifest ({where}: {first['msg']})"
            ) from exc

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def wheel_version(self, project: str) -> str | None:
        """The version of ``project``'s wheel in the wheelhouse, if it has one."""
        wanted = project.lower().replace("-", "_")
        for f in self.files:
            name = f.path.rpartition("/")[2]
            if f.kind != "wheel" or not name.endswith(".whl"):
                continue
            parts = name[: -len(".whl")].split("-")
            if len(parts) >= 5 and parts[0].lower() == wanted:
                return parts[1]
        return None
