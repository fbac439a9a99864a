"""The bundle manifest: every file with its size and sha256, what it is, and for
which target. The exact bytes of ``manifest.json`` are what is signed.

Every field is bounded (lengths, counts, ranges, formats): a signature says who
vouched for a manifest, not that its values are sane, so an absurd value is
refused with the field's name before anything else reads it."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from letsinfer.bundle.paths import MANIFEST_NAME, SIGNATURE_NAME, path_problem

FORMAT: Final = "letsinfer-bundle/1"
SHA256 = r"^[0-9a-f]{64}$"
MAX_FILES = 100_000
MAX_FILE_SIZE = 1 << 50  # 1 PiB


def _iso_time(value: str) -> str:
    datetime.fromisoformat(value)  # ValueError: not a time
    return value


_Text = Annotated[str, Field(max_length=256)]
_Short = Annotated[str, Field(min_length=1, max_length=128)]
_Digest = Annotated[str, Field(pattern=SHA256)]


class ManifestError(Exception):
    """The manifest is not a well-formed bundle manifest."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class BundleFile(_Part):
    path: str = Field(max_length=1024)
    size: int = Field(ge=0, le=MAX_FILE_SIZE)
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
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")  # a model's name
    path: str = Field(max_length=1024)  # one of the manifest's files (a split model's first part)
    format: Literal["gguf"] = "gguf"
    source: ModelSource | None = None


class BundleRuntime(_Part):
    """A runtime release: its artifacts are named by digest, each one a listed file."""

    id: _Short
    engine: _Short
    version: _Short
    target: str = Field(pattern=r"^[a-z0-9_-]{1,16}$")
    artifacts: dict[_Short, _Digest] = Field(max_length=64)
    launch: dict[_Short, Annotated[str, Field(max_length=4096)]] = Field(max_length=64)


class Target(_Part):
    # pip platform tags; empty: the creating machine's own
    platforms: tuple[_Short, ...] = Field(max_length=64)
    python_version: str = Field(pattern=r"^3\.[0-9]{1,3}$")
    built_on: _Text  # the creating machine's OS and architecture


class Manifest(_Part):
    format: Literal["letsinfer-bundle/1"] = FORMAT
    created_at: Annotated[str, Field(max_length=64), AfterValidator(_iso_time)]
    created_by: _Text
    target: Target
    files: tuple[BundleFile, ...] = Field(max_length=MAX_FILES)
    models: tuple[BundleModel, ...] = Field((), max_length=1024)
    runtimes: tuple[BundleRuntime, ...] = Field((), max_length=256)

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
