"""A restart that keeps engines serving: the request the old process acts on.

``letsinfer service restart`` writes ``<run>/handover.json`` naming the running
node's pid, then stops that node as ``service stop`` would. A node that finds
the request addressed to itself when it shuts down leaves its ready engines
running (see agent/supervisor.py) for the next start to adopt; without it, a
stopping node stops its engines. The run folder is the node user's own (0700),
so only who may signal the node may ask this.
"""

from __future__ import annotations

import json
import os
import time

from letsinfer.home import Home

_FRESH_S = 600.0  # an older request is left over from a restart that never happened


def request(home: Home, pid: int) -> None:
    path = home.handover_request
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"pid": pid, "at": time.time()}, fh)
    tmp.replace(path)


def cancel(home: Home) -> None:
    home.handover_request.unlink(missing_ok=True)


def take(home: Home) -> bool:
    """Whether a fresh request names this process; the request is used up."""
    path = home.handover_request
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as fh:
            asked = json.load(fh)
    except (OSError, ValueError):
        return False
    if asked.get("pid") != os.getpid():
        return False
    path.unlink(missing_ok=True)
    return isinstance(asked.get("at"), int | float) and time.time() - asked["at"] < _FRESH_S
