"""``mirror add``: one artifact into the mirror, from a URL or a file, by its sha256.

The bytes go to a temporary name inside the mirror; only when their length
(the size the source announced) and their sha256 both match are they renamed
into place and listed in the catalog. A refused artifact leaves nothing.
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Literal

import httpx

from letsinfer.bundle.progress import Progress
from letsinfer.fetch import FetchPolicy, FetchRefused, check_url, guarded_client
from letsinfer.mirror.catalog import ArtifactRecord, read_catalog, write_catalog
from letsinfer.mirror.errors import MirrorError
from letsinfer.mirror.layout import DIGEST, MirrorLayout

Kind = Literal["wheel", "model", "runtime"]


def _copy(src: BinaryIO, dst: BinaryIO, progress: Progress) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    while chunk := src.read(1 << 20):
        h.update(chunk)
        dst.write(chunk)
        size += len(chunk)
        progress.advance(len(chunk))
    return size, h.hexdigest()


def _from_url(
    url: str, dst: BinaryIO, progress: Progress, policy: FetchPolicy
) -> tuple[int, int | None, str]:
    h = hashlib.sha256()
    size = 0
    try:
        with (
            guarded_client(policy, follow_redirects=True, timeout=30.0) as client,
            client.stream("GET", url) as response,
        ):
            if response.status_code != 200:
                raise MirrorError(f"{url}: HTTP {response.status_code}")
            announced = response.headers.get("Content-Length")
            expected = int(announced) if announced and announced.isdigit() else None
            progress.start(f"downloading {url.rsplit('/', 1)[-1]}", expected)
            for chunk in response.iter_bytes(1 << 20):
                h.update(chunk)
                dst.write(chunk)
                size += len(chunk)
                progress.advance(len(chunk))
    except FetchRefused as exc:
        raise MirrorError(f"{exc}; nothing added") from exc
    except httpx.HTTPError as exc:
        raise MirrorError(f"{url}: {exc}") from exc
    return size, expected, h.hexdigest()


def add_artifact(
    layout: MirrorLayout,
    source: str,
    sha256: str,
    kind: Kind,
    progress: Progress,
    policy: FetchPolicy,
) -> tuple[ArtifactRecord, bool]:
    """The artifact's record, and whether it is new to the mirror. A URL is
    fetched only as ``policy`` allows (its addresses and redirects)."""
    digest = sha256.removeprefix("sha256:").lower()
    if not DIGEST.fullmatch(digest):
        raise MirrorError(f"--sha256 {sha256}: expected 64 hex digits")
    is_url = "://" in source
    path = Path(source).expanduser()
    if is_url:
        try:
            # Refused before anything is created; the client checks again at
            # connect time (and each redirect), where a changed DNS answer counts.
            check_url(source, policy)
        except FetchRefused as exc:
            raise MirrorError(f"{exc}; nothing added") from exc
    elif not path.is_file():
        raise MirrorError(f"{source}: no such file (or give an http(s) URL)")
    name = source.rstrip("/").rsplit("/", 1)[-1]
    with layout.locked():
        catalog = read_catalog(layout)
        known = catalog.artifacts.get(digest)
        if known is not None and layout.blob(digest).is_file():
            return known, False
        layout.blobs.mkdir(parents=True, exist_ok=True)
        tmp = layout.root / f".add-{os.getpid()}-{digest[:12]}.part"
        try:
            with tmp.open("wb") as dst:
                if is_url:
                    size, expected, actual = _from_url(source, dst, progress, policy)
                else:
                    expected = path.stat().st_size
                    progress.start(f"copying {name}", expected)
                    with path.open("rb") as src:
                        size, actual = _copy(src, dst, progress)
                progress.finish()
                dst.flush()
                os.fsync(dst.fileno())
            if expected is not None and size != expected:
                raise MirrorError(f"{source}: {size} of {expected} bytes arrived; nothing added")
            if actual != digest:
                raise MirrorError(f"{source}: its sha256 is {actual}, not {digest}; nothing added")
            tmp.chmod(0o444)
            os.replace(tmp, layout.blob(digest))
            record = ArtifactRecord(
                digest=digest,
                size=size,
                kind=kind,
                names=[name],
                bundles=[],
                imported_at=datetime.now(UTC).isoformat(timespec="seconds"),
            )
            catalog.artifacts[digest] = record
            write_catalog(layout, catalog)  # the commit point
        except BaseException:
            progress.finish()
            tmp.unlink(missing_ok=True)
            raise
    return record, True
