"""A restart that keeps engines serving: the request the old process acts on.

``letsinfer service restart`` writes ``<run>/handover.json`` naming the running
node's pid, then stops that node as ``service stop`` would; a plain
``systemctl restart`` of the node role's unit is recognised by systemd's own
job (:func:`systemd_restarting`). A node being restarted leaves its ready
engines running (see agent/supervisor.py) for the next start to adopt, and
keeps its gateway socket open for it (service/listener.py); without it, a
stopping node stops its engines. The run folder is the node user's own (0700),
so only who may signal the node may ask this.
"""

from __future__ import annotations

import json
import os
import subprocess
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


def asked(home: Home) -> bool:
    """Whether this process is being restarted (the request stays): a fresh
    request names it, or systemd is restarting its unit."""
    return _requested(home) or systemd_restarting()


def systemd_restarting() -> bool:
    """A plain `systemctl restart` of the unit running this process: systemd
    sends the same SIGTERM as for a stop, but the unit's job says restart.
    The node role's unit names itself in LETSINFER_SYSTEMD_UNIT; INVOCATION_ID
    is systemd's own mark on the processes it starts."""
    unit = os.environ.get("LETSINFER_SYSTEMD_UNIT")
    if not unit or not os.environ.get("INVOCATION_ID"):
        return False
    try:
        jobs = subprocess.run(
            ["systemctl", "list-jobs", "--no-legend", "--plain", unit],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    # JOB UNIT TYPE STATE: "41 letsinfer.service restart running"
    return any(line.split()[1:3] == [unit, "restart"] for line in jobs.splitlines())


def _requested(home: Home) -> bool:
    try:
        fd = os.open(home.handover_request, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as fh:
            request = json.load(fh)
    except (OSError, ValueError):
        return False
    if not isinstance(request, dict) or request.get("pid") != os.getpid():
        return False
    at = request.get("at")
    return isinstance(at, int | float) and time.time() - at < _FRESH_S


def take(home: Home) -> bool:
    """Whether a fresh request names this process; the request is used up."""
    if not asked(home):
        return False
    home.handover_request.unlink(missing_ok=True)
    return True
