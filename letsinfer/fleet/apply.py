"""Run one of the collection's playbooks through ansible-runner, with progress.

The progress model (``Progress``) is plain data fed by ansible-runner's events,
so it is tested without running Ansible; ``apply`` wires it to a real run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ansible-runner event name -> the status a person reads
_STATUS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_skipped": "skipped",
    "runner_on_unreachable": "unreachable",
    "runner_item_on_failed": "failed",
}


class FleetError(Exception):
    """The playbook or inventory cannot be used; the message says which and why."""


@dataclass
class HostProgress:
    host: str
    task: str = ""
    status: str = "waiting"
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: int = 0
    rescued: int = 0
    ignored: int = 0


@dataclass
class Progress:
    """What the live view shows: per host, the current task and its status."""

    play: str = ""
    hosts: dict[str, HostProgress] = field(default_factory=dict)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # host, task, message
    # what the playbook said loudly without failing (letsinfer.cluster.warning)
    warnings: list[tuple[str, str]] = field(default_factory=list)  # host, message
    finished: bool = False

    def host(self, name: str) -> HostProgress:
        if name not in self.hosts:
            self.hosts[name] = HostProgress(name)
        return self.hosts[name]

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            self.play = str(data.get("play", ""))
            return
        if kind == "playbook_on_stats":
            self._stats(data)
            return
        name = data.get("host")
        if not name:
            return
        hp = self.host(str(name))
        task = str(data.get("task") or "")
        if kind == "runner_on_start":
            hp.task, hp.status = task, "running"
        elif kind in _STATUS:
            res = data.get("res") or {}
            status = _STATUS[kind]
            if status == "ok" and isinstance(res, dict) and res.get("changed"):
                status = "changed"
            if status == "failed" and data.get("ignore_errors"):
                status = "ignored"
            hp.task, hp.status = task, status
            if status == "ok" and isinstance(res, dict):
                self.warnings += [(hp.host, str(w)) for w in res.get("warnings") or ()]
            if status in ("failed", "unreachable") and kind != "runner_item_on_failed":
                message = res.get("msg") if isinstance(res, dict) else None
                self.failures.append((hp.host, task, str(message or res)[:2000]))

    def _stats(self, data: Mapping[str, Any]) -> None:
        self.finished = True
        for key, attr in (
            ("ok", "ok"),
            ("changed", "changed"),
            ("failures", "failed"),
            ("skipped", "skipped"),
            ("dark", "unreachable"),
            ("rescued", "rescued"),
            ("ignored", "ignored"),
        ):
            for host, count in (data.get(key) or {}).items():
                setattr(self.host(str(host)), attr, int(count))
        for hp in self.hosts.values():
            if hp.failed or hp.unreachable:
                hp.status = "failed" if hp.failed else "unreachable"
            else:
                hp.status = "done"
            hp.task = ""


@dataclass(frozen=True)
class ApplyResult:
    rc: int
    status: str
    progress: Progress

    @property
    def ok(self) -> bool:
        return self.rc == 0


def find_playbook(name: str, search: Sequence[Path]) -> Path:
    """``name`` as a path, else ``<dir>/<name>`` (``.yml`` optional) in ``search``."""
    path = Path(name).expanduser()
    if path.is_file():
        return path.absolute()
    candidates = [d / n for d in search for n in (name, f"{name}.yml")]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.absolute()
    raise FleetError(
        f"no playbook {name!r}: not a file, and not in "
        + (", ".join(str(d) for d in search) or "any playbooks directory")
    )


def find_ansible_cfg(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        candidate = folder / "ansible.cfg"
        if candidate.is_file():
            return candidate
    return None


def _binary(name: str) -> str:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FleetError(f"{name} not found: install letsinfer with ansible-core")
    return found


def apply(
    playbook: Path,
    inventory: Path,
    *,
    extravars: Mapping[str, Any] | None = None,
    limit: str | None = None,
    check: bool = False,
    on_event: Callable[[Progress], None] | None = None,
) -> ApplyResult:
    """Run ``playbook`` against ``inventory``; ``on_event`` sees the progress after each event."""
    try:
        import ansible_runner
    except ImportError:
        raise FleetError("letsinfer fleet needs Ansible: pip install 'letsinfer[fleet]'") from None

    if not inventory.exists():
        raise FleetError(f"no inventory at {inventory}")
    progress = Progress()
    cmdline = []
    if check:
        cmdline.append("--check")
    if limit:
        cmdline += ["--limit", limit]
    envvars: dict[str, str] = {"ANSIBLE_FORCE_COLOR": "0"}
    cfg = find_ansible_cfg(playbook.parent)
    if cfg is not None:
        envvars["ANSIBLE_CONFIG"] = str(cfg)
    elif (playbook.parent.parent / "collections").is_dir():
        # The collection as the wheel installs it (share/letsinfer/ansible):
        # playbooks beside an installed letsinfer.cluster, no ansible.cfg.
        envvars["ANSIBLE_COLLECTIONS_PATH"] = str(playbook.parent.parent / "collections")
    bindir = str(Path(_binary("ansible-playbook")).parent)
    path = os.environ.get("PATH", "")
    if bindir not in path.split(os.pathsep):  # ansible-runner looks ansible-playbook up here
        os.environ["PATH"] = bindir + os.pathsep + path

    def handler(event: dict[str, Any]) -> bool:
        progress.feed(event)
        if on_event is not None:
            on_event(progress)
        return False  # do not keep per-event files on disk

    with tempfile.TemporaryDirectory(prefix="letsinfer-fleet-") as private:
        runner = ansible_runner.run(
            private_data_dir=private,
            playbook=str(playbook),
            inventory=str(inventory.absolute()),
            extravars=dict(extravars or {}),
            cmdline=" ".join(cmdline) or None,
            envvars=envvars,
            project_dir=str(playbook.parent),
            event_handler=handler,
            quiet=True,
            suppress_env_files=True,
        )
        if not progress.hosts and runner.rc != 0:  # ansible failed before any host ran
            output = runner.stdout.read() if runner.stdout else ""
            progress.failures.append(("-", "ansible-playbook", output.strip()[-3000:]))
    return ApplyResult(rc=int(runner.rc), status=str(runner.status), progress=progress)
