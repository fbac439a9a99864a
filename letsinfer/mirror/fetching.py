"""Fetch an artifact from a mirror by digest, resuming a partial download, and
verify it before anyone can use it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx

from letsinfer.mirror.layout import DIGEST


class FetchError(Exception):
    """The artifact could not be fetched or did not match its digest."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


async def fetch_artifact(client: httpx.AsyncClient, base_url: str, digest: str, dest: Path) -> Path:
    """Download ``digest`` to ``dest``; ``dest`` appears only once its bytes match."""
    if not DIGEST.fullmatch(digest):
        raise FetchError(f"not a sha256 digest: {digest!r}")
    partial = dest.with_name(f".{dest.name}.{digest[:12]}.part")
    have = partial.stat().st_size if partial.exists() else 0
    headers = {"Range": f"bytes={have}-", "If-Range": f'"{digest}"'} if have else {}
    url = f"{base_url.rstrip('/')}/mirror/sha256/{digest}"
    async with client.stream("GET", url, headers=headers) as response:
        if response.status_code == 416:
            pass  # the partial file is already whole (or too long): the check below decides
        elif response.status_code == 206:
            with partial.open("ab") as fh:
                async for chunk in response.aiter_bytes():
                    fh.write(chunk)
        elif response.status_code == 200:
            with partial.open("wb") as fh:  # the server sent it all: start over
                async for chunk in response.aiter_bytes():
                    fh.write(chunk)
        else:
            raise FetchError(f"{url}: HTTP {response.status_code}")
    actual = _sha256(partial)
    if actual != digest:
        partial.unlink()
        raise FetchError(f"{url}: the bytes received have sha256 {actual}, not {digest}")
    with partial.open("rb") as fh:
        os.fsync(fh.fileno())
    partial.replace(dest)
    return dest
