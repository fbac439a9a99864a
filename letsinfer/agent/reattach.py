"""Re-attaching to this node's running engines after its letsinfer process restarts.

At launch the supervisor writes a record per engine (``<run>/engines/<pg>.<task>.engine.json``,
0600 in a 0700 folder): the placement it runs, its pid, the kernel's start time
of that pid and boot id, its exact command line, a random launch nonce (also
put in the engine's environment), its port and engine key. After a restart an
engine is adopted only if every one of these holds against the live system:

- the record is a regular file of this user, 0600, not a link;
- the pid lives, was started at the recorded time in this boot, runs as this
  user, with the recorded command line and the nonce in its environment;
- the socket listening on the recorded port belongs to that process (or the
  binary it keeps, see engines/keeper.py);
- the engine answers ``/health`` and accepts the recorded key while refusing
  another.

Anything else is not this node's engine: it is never adopted and never
signalled (the record is dropped; the group starts a new engine).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from letsinfer.agent.processes import AdoptedProcess

NONCE_ENV = "LETSINFER_ENGINE_NONCE"
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_RECORD_SUFFIX = ".engine.json"


class LaunchRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pg_id: str
    task: str
    service: str
    placement: str  # fingerprint of the desired placement it was launched for
    release_id: str
    base_url: str
    port: int
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: when the kernel started it
    boot_id: str
    uid: int
    argv: list[str]
    nonce: str
    engine_key: str | None  # None for a task that serves no API (a parallel worker)


def record_path(run_dir: Path, pg_id: str, task: str) -> Path:
    if not (_SAFE_ID.fullmatch(pg_id) and _SAFE_ID.fullmatch(task)):
        raise ValueError(f"unsafe placement group or task id {pg_id!r}/{task!r}")
    return run_dir / f"{pg_id}.{task}{_RECORD_SUFFIX}"


def lease_path(run_dir: Path, pg_id: str, task: str) -> Path:
    return record_path(run_dir, pg_id, task).with_name(f"{pg_id}.{task}.lease")


def new_nonce() -> str:
    return secrets.token_hex(16)


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def start_ticks(pid: int) -> int | None:
    """When the kernel started ``pid`` (clock ticks since boot); None if it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def write_record(path: Path, record: LaunchRecord) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(record.model_dump_json())
    tmp.replace(path)


def remove(run_dir: Path, pg_id: str, task: str) -> None:
    for path in (record_path(run_dir, pg_id, task), lease_path(run_dir, pg_id, task)):
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Found:
    path: Path
    record: LaunchRecord | None
    problem: str | None = None  # why the file is no record this node trusts


def read_records(run_dir: Path) -> list[Found]:
    """Every launch record left in ``run_dir``, each either parsed or refused with why."""
    out = []
    try:
        names = sorted(os.listdir(run_dir))
    except FileNotFoundError:
        return []
    for name in names:
        if name.endswith(_RECORD_SUFFIX) and not name.startswith("."):
            out.append(_read(run_dir / name))
    return out


def _read(path: Path) -> Found:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        return Found(path, None, f"cannot open it without following links: {exc.strerror}")
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return Found(path, None, "not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return Found(path, None, f"owned by uid {st.st_uid} with mode {st.st_mode & 0o777:o}")
        try:
            record = LaunchRecord.model_validate_json(fh.read(65536))
        except ValidationError as exc:
            return Found(path, None, f"not a launch record ({exc.error_count()} error(s))")
    if path.name != f"{record.pg_id}.{record.task}{_RECORD_SUFFIX}":
        return Found(path, None, f"names {record.pg_id}/{record.task}, not its file name")
    return Found(path, record)


def running(run_dir: Path) -> list[tuple[str, int]]:
    """(placement group, pid) of each recorded engine whose process still runs."""
    return [
        (f.record.pg_id, f.record.pid)
        for f in read_records(run_dir)
        if f.record is not None and start_ticks(f.record.pid) == f.record.start_ticks
    ]


# -- the proof -----------------------------------------------------------------


def _listening_inodes(pid: int, port: int) -> set[int]:
    """Inodes of sockets listening on ``port`` in ``pid``'s network namespace."""
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(int(cols[9]))
    return found


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(raw[raw.rindex(")") + 2 :].split()[1]) == pid:
            kids.append(int(entry))
    return kids


def _uid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def check_process(record: LaunchRecord) -> str | None:
    """Why the live process is not the engine this record launched, or None."""
    if record.boot_id != boot_id():
        return "it was launched before this machine last booted"
    ticks = start_ticks(record.pid)
    if ticks is None:
        return f"pid {record.pid} is gone"
    if ticks != record.start_ticks:
        return f"pid {record.pid} is another process now (started at another time)"
    if _uid(record.pid) != os.geteuid():
        return f"pid {record.pid} runs as another user"
    try:
        argv = Path(f"/proc/{record.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        environ = Path(f"/proc/{record.pid}/environ").read_bytes().split(b"\0")
    except OSError as exc:
        return f"pid {record.pid} cannot be read: {exc.strerror}"
    if [a.decode(errors="replace") for a in argv] != record.argv:
        return f"pid {record.pid} runs another command line"
    if f"{NONCE_ENV}={record.nonce}".encode() not in environ:
        return f"pid {record.pid} does not carry the launch nonce"
    listening = _listening_inodes(record.pid, record.port)
    owned = _socket_inodes(record.pid)
    for child in _children(record.pid):  # a binary kept by engines/keeper.py
        owned |= _socket_inodes(child)
    if not listening & owned:
        return f"pid {record.pid} does not listen on port {record.port}"
    return None


async def check_answers(record: LaunchRecord, client: httpx.AsyncClient) -> str | None:
    """Why the engine on the recorded port is not answering as this node's engine, or None."""
    try:
        health = await client.get(record.base_url + "/health")
        if health.status_code != 200:
            return f"its /health answers {health.status_code}"
        if record.engine_key is None:
            return None
        url = record.base_url + "/v1/models"
        ours = await client.get(url, headers={"authorization": f"Bearer {record.engine_key}"})
        other = await client.get(url, headers={"authorization": f"Bearer {new_nonce()}"})
    except httpx.HTTPError as exc:
        return f"it does not answer on {record.base_url}: {exc}"
    if ours.status_code != 200 or other.status_code != 401:
        return (
            f"it does not hold this placement group's engine key ({ours.status_code} with "
            f"the key, {other.status_code} with another)"
        )
    return None


async def prove(record: LaunchRecord, client: httpx.AsyncClient) -> AdoptedProcess | str:
    """The engine, held by a pidfd, if the live system proves the record; else why not."""
    try:
        pidfd = os.pidfd_open(record.pid)
    except ProcessLookupError:
        return f"pid {record.pid} is gone"
    # Checked after the pidfd is open: it names the very process that passed.
    why = check_process(record) or await check_answers(record, client)
    if why is not None:
        os.close(pidfd)
        return why
    return AdoptedProcess(record.pid, pidfd)
