"""An engine's lease: how an engine knows that an agent still owns it.

Engines outlive their agent (a restart of the node's letsinfer process re-adopts
them), so nothing in the kernel ends them when the agent dies. Instead the agent
renews a lease file per engine (its mtime) every few seconds, and the engine
stops itself once the lease is older than its grace period or gone: a node
killed outright, and not started again in time, leaves no engine behind.

Both sides read the same two environment variables, set by the supervisor.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

LEASE_ENV = "LETSINFER_ENGINE_LEASE"  # path of the lease file
GRACE_ENV = "LETSINFER_ENGINE_LEASE_GRACE_S"  # seconds without renewal before it stops


def renew(path: Path) -> None:
    """Create the lease (0600) or move its mtime to now."""
    try:
        os.utime(path)
    except FileNotFoundError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)


def expired(path: Path, grace_s: float, now: float | None = None) -> bool:
    """Whether nobody renewed the lease for ``grace_s`` (a removed lease is expired)."""
    try:
        renewed = os.stat(path, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return True
    return (time.time() if now is None else now) - renewed > grace_s


class LeaseWatch:
    """The engine's side: read from the environment once, asked every second."""

    def __init__(self, path: Path | None, grace_s: float) -> None:
        self.path = path
        self.grace_s = grace_s

    @classmethod
    def from_environment(cls) -> LeaseWatch:
        path = os.environ.pop(LEASE_ENV, "")
        grace = float(os.environ.pop(GRACE_ENV, "0") or 0)
        return cls(Path(path) if path else None, grace)

    def lost(self) -> bool:
        """True once the agent stopped renewing (never, for an engine started by hand)."""
        return self.path is not None and expired(self.path, self.grace_s)
