# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Talk to a letsinfer node through its command line's ``--json`` output.

Modules run on the node itself and call its ``letsinfer`` executable; the
node's local admin socket will replace this transport later without changing
the modules' interface. ``run_command`` is injected (``AnsibleModule.run_command``
in production, a fake in unit tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

DEFAULT_EXECUTABLE = "/opt/letsinfer/current/bin/letsinfer"


class CliError(Exception):
    """A letsinfer command failed; ``message`` carries the command and its stderr."""

    def __init__(self, argv, rc, stdout, stderr):
        self.argv = list(argv)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        detail = (stderr or stdout or "").strip()
        super().__init__("`{}` exited with {}: {}".format(" ".join(self.argv), rc, detail))


class LetsinferCli:
    def __init__(self, run_command, executable=DEFAULT_EXECUTABLE, home=None):
        self._run_command = run_command
        self.executable = executable
        self.home = home

    def installed(self):
        return os.path.isfile(self.executable) and os.access(self.executable, os.X_OK)

    def argv(self, *args):
        argv = [self.executable]
        if self.home:
            argv += ["--home", self.home]
        return argv + list(args)

    def run(self, *args, **kwargs):
        """Run a command; raise CliError on a non-zero exit unless ``ok_codes`` allows it."""
        ok_codes = kwargs.get("ok_codes", (0,))
        argv = self.argv(*args)
        rc, out, err = self._run_command(argv)
        if rc not in ok_codes:
            raise CliError(argv, rc, out, err)
        return rc, out, err

    def json(self, *args, **kwargs):
        rc, out, _err = self.run(*args, **kwargs)
        try:
            return json.loads(out)
        except ValueError:
            raise CliError(self.argv(*args), rc, out, f"output is not JSON: {out[:200]}") from None

    def version(self):
        """The installed version (``letsinfer --version`` prints ``letsinfer, version X``)."""
        if not self.installed():
            return None
        rc, out, err = self._run_command([self.executable, "--version"])
        if rc != 0:
            raise CliError([self.executable, "--version"], rc, out, err)
        return out.strip().rsplit(" ", 1)[-1]

    def status(self):
        """``letsinfer status --json``: one object (a one-item list from releases
        before this one, which an upgrade may still be running)."""
        data = self.json("status", "--json")
        if isinstance(data, list):
            data = data[0] if data else {}
        return data


def processes_mentioning(paths, proc="/proc"):
    """PIDs in this mount namespace whose command line mentions one of ``paths``.

    Hosts that share a PID namespace but not a filesystem view (containers,
    the lab) never see each other's processes through this. The caller and its
    ancestors are never included.
    """
    needles = [p.encode() for p in paths if p]
    if not needles:
        return []
    own_ns = os.stat(f"{proc}/self/ns/mnt").st_ino
    skip = set()
    pid = os.getpid()
    while pid > 1:
        skip.add(pid)
        try:
            with open(f"{proc}/{pid}/stat", "rb") as fh:
                pid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            if os.stat(f"{proc}/{entry}/ns/mnt").st_ino != own_ns:
                continue
            with open(f"{proc}/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            found.append(int(entry))
    return sorted(found)


def terminate(pids, grace=10.0):
    """SIGTERM, then SIGKILL whatever is left after ``grace`` seconds."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _alive(p)]
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
