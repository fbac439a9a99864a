"""Creating a bundle on a connected machine: collect, hash, sign, pack.

Everything that can be refused (the key, the models, the runtime specs) is
checked before the long downloads start. The tar and its ``.sha256`` appear
only when complete.
"""

from __future__ import annotations

import hashlib
import platform
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from letsinfer import __version__
from letsinfer.bundle import wheelhouse
from letsinfer.bundle.archive import BundleError, Entry, pack
from letsinfer.bundle.contents import (
    BundledModel,
    BundledRuntime,
    Kind,
    parse_runtime,
    resolve_model,
    resolve_runtime,
)
from letsinfer.bundle.hubmodels import fetch_hub_models, is_hub_spec, resolve_hub_models
from letsinfer.bundle.importing import checksum_file
from letsinfer.bundle.manifest import (
    BundleFile,
    BundleModel,
    BundleRuntime,
    Manifest,
    Target,
)
from letsinfer.bundle.paths import MANIFEST_NAME, SIGNATURE_NAME
from letsinfer.bundle.progress import Progress, Silent
from letsinfer.bundle.wheelpins import LISTING_NAME, LISTING_SIGNATURE, signed_listing
from letsinfer.home import Home
from letsinfer.release.keys import load_private, public_key_of
from letsinfer.release.signatures import sha256_file, sign_bytes

_PYTHON_VERSION = re.compile(r"3\.\d+")


@dataclass(frozen=True)
class CreateRequest:
    out: Path
    key: Path
    models: Sequence[str] = ()
    runtimes: Sequence[str] = ()
    platforms: Sequence[str] = ()
    python_version: str | None = None
    wheels: bool = True
    source: Path | None = None


@dataclass(frozen=True)
class Created:
    path: Path
    sha256: str
    checksum_file: Path
    manifest: Manifest
    signer: str


@dataclass
class _Files:
    by_path: dict[str, tuple[Path, Kind]] = field(default_factory=dict)

    def add(self, path: str, source: Path, kind: Kind) -> None:
        if path in self.by_path:
            raise BundleError(f"two files would both be {path!r} in the bundle")
        self.by_path[path] = (source, kind)


def _hash_files(files: _Files, progress: Progress) -> list[BundleFile]:
    total = sum(src.stat().st_size for src, _ in files.by_path.values())
    progress.start("hashing files", total)
    out = []
    try:
        for path, (source, kind) in sorted(files.by_path.items()):
            h = hashlib.sha256()
            size = 0
            with source.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
                    size += len(chunk)
                    progress.advance(len(chunk))
            out.append(BundleFile(path=path, size=size, sha256=h.hexdigest(), kind=kind))
    finally:
        progress.finish()
    return out


def _write_checksum(bundle: Path, digest: str) -> Path:
    sums = checksum_file(bundle)
    tmp = sums.with_name(f".{sums.name}.part")
    tmp.write_text(f"{digest}  {bundle.name}\n")  # the format `sha256sum -c` reads
    tmp.replace(sums)
    return sums


@contextmanager
def _step(progress: Progress, description: str) -> Iterator[None]:
    progress.start(description, None)
    try:
        yield
    finally:
        progress.finish()


def _manifest(
    request: CreateRequest,
    python_version: str,
    listed: list[BundleFile],
    models: list[BundledModel],
    runtimes: list[BundledRuntime],
    pulled: list[BundleModel],
) -> Manifest:
    digest_of = {f.path: f.sha256 for f in listed}
    return Manifest(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        created_by=f"letsinfer {__version__} on {platform.node()}",
        target=Target(
            platforms=tuple(request.platforms),
            python_version=python_version,
            built_on=f"{platform.system().lower()}-{platform.machine()}",
        ),
        files=tuple(listed),
        models=(*(BundleModel(name=m.name, path=m.path) for m in models), *pulled),
        runtimes=tuple(
            BundleRuntime(
                id=r.id,
                engine=r.engine,
                version=r.version,
                target=r.target,
                artifacts={name: digest_of[path] for name, path in r.artifacts.items()},
                launch=r.launch,
            )
            for r in runtimes
        ),
    )


def create_bundle(home: Home, request: CreateRequest, progress: Progress | None = None) -> Created:
    progress = progress or Silent()
    # Everything that can be refused is checked before the long steps start.
    private = load_private(request.key.expanduser())
    out = request.out.expanduser().absolute()
    if not out.parent.is_dir():
        raise BundleError(f"--out {request.out}: folder {out.parent} does not exist")
    python_version = request.python_version or f"{sys.version_info[0]}.{sys.version_info[1]}"
    if not _PYTHON_VERSION.fullmatch(python_version):
        raise BundleError(f"--python-version {python_version}: expected 3.N (for example 3.11)")
    models = [resolve_model(spec, home) for spec in request.models if not is_hub_spec(spec)]
    if len({m.path for m in models}) != len(models):
        raise BundleError("two --model entries have the same name")
    # Asked of the hub now (the revision becomes a commit); downloaded below.
    hub_models = [resolve_hub_models(home, s) for s in request.models if is_hub_spec(s)]
    runtime_specs = [parse_runtime(spec) for spec in request.runtimes]
    source = wheelhouse.find_source_tree(request.source) if request.wheels else None

    files = _Files()
    for m in models:
        files.add(m.path, m.source, "model")
    target = (request.platforms, request.python_version)
    with tempfile.TemporaryDirectory(prefix=".bundle-", dir=out.parent) as tmp:
        work = Path(tmp)
        wheel_paths: dict[str, tuple[str, Path]] = {}
        if source is not None:
            with _step(progress, "building the letsinfer wheel"):
                built = wheelhouse.build_letsinfer_wheel(source, work)
            with _step(progress, "downloading dependency wheels for the target"):
                wheels = wheelhouse.download_wheels([str(built)], work / "wheelhouse", *target)
            for wheel in wheels:
                wheel_paths[wheel.name] = (f"wheelhouse/{wheel.name}", wheel)
                files.add(f"wheelhouse/{wheel.name}", wheel, "wheel")
            # The wheelhouse carries its own signed list, so that it is checked
            # again where it is installed from, apart from the bundle.
            for name, content in zip(
                (LISTING_NAME, LISTING_SIGNATURE), signed_listing(wheels, private), strict=True
            ):
                (work / "wheelhouse" / name).write_bytes(content)
                files.add(f"wheelhouse/{name}", work / "wheelhouse" / name, "wheel")

        def download(requirement: str) -> Path:
            dest = work / "runtimes" / hashlib.sha256(requirement.encode()).hexdigest()[:12]
            with _step(progress, f"downloading {requirement}"):
                return wheelhouse.download_wheels([requirement], dest, *target, with_deps=False)[0]

        runtimes = [resolve_runtime(s, wheel_paths, download, files.add) for s in runtime_specs]
        pulled = [
            m
            for chosen, source in hub_models
            for m in fetch_hub_models(chosen, source, work, progress, files.add)
        ]
        listed = _hash_files(files, progress)
        manifest = _manifest(request, python_version, listed, models, runtimes, pulled)
        data = manifest.to_bytes()
        entries = [
            Entry(MANIFEST_NAME, data),
            Entry(SIGNATURE_NAME, sign_bytes(data, private).to_json()),
            *(Entry(f.path, files.by_path[f.path][0]) for f in listed),
        ]
        try:
            pack(out, entries, int(time.time()), progress)
            digest = sha256_file(out)
            sums = _write_checksum(out, digest)
        except OSError as exc:
            raise BundleError(f"cannot write {out} ({exc})") from exc
    return Created(out, digest, sums, manifest, public_key_of(private).fingerprint)
