"""Where the mirror lives under a home, and the lock that serialises changes to it.

``<var>/mirror/sha256/<digest>`` holds each artifact once (read-only).
``<var>/mirror/bundles/<id>/`` is an imported bundle's own tree of hard links
to those blobs (``wheelhouse/`` is what ``pip --find-links`` reads).
``<var>/mirror/catalog.json`` is the commit point: what it lists is imported.
Names starting with a dot are work in progress and never part of the mirror.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from letsinfer.home import Home

DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class MirrorLayout:
    root: Path
    lock_file: Path

    @classmethod
    def for_home(cls, home: Home) -> MirrorLayout:
        # The lock lives with the home's other runtime files, so taking it
        # never changes the mirror's own tree.
        return cls(root=home.var / "mirror", lock_file=home.run / "mirror.lock")

    @property
    def blobs(self) -> Path:
        return self.root / "sha256"

    def blob(self, digest: str) -> Path:
        if not DIGEST.fullmatch(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.blobs / digest

    @property
    def bundles(self) -> Path:
        return self.root / "bundles"

    def bundle_dir(self, bundle_id: str) -> Path:
        return self.bundles / bundle_id

    @property
    def catalog_file(self) -> Path:
        return self.root / "catalog.json"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the mirror's lock: one import or removal at a time per home.
        The lock file goes away when released (a refused import leaves nothing,
        not even it); whoever waited on a file that is gone takes the new one."""
        parent = self.lock_file.parent
        made_parent = not parent.exists()
        while True:
            parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
            except FileNotFoundError:  # another holder just removed the empty folder
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(self.lock_file).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                break
            os.close(fd)  # released and removed while we waited: lock the new one
        try:
            yield
        finally:
            with suppress(FileNotFoundError):
                self.lock_file.unlink()  # still ours: nobody else holds it
            os.close(fd)
            if made_parent:
                with suppress(OSError):
                    parent.rmdir()  # only if empty
