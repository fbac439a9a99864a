"""Where a node keeps its files. Every path derives from one home.

As root the defaults follow the FHS (``/etc/letsinfer``, ``/var/lib/letsinfer``,
``/run/letsinfer``); an ordinary user gets one directory under
``~/.local/share``. ``--home DIR`` or ``LETSINFER_HOME`` puts all three under
DIR, so several nodes can share one machine (tests, the lab).
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "LETSINFER_HOME"
# Who besides root may use a node's CLI: the admin socket, the authority,
# node.json and config.toml (never a key).
ADMIN_GROUP = "letsinfer"


@dataclass(frozen=True)
class Home:
    etc: Path  # config, keys, certificates (0700)
    var: Path  # authority database, model store, logs
    run: Path  # sockets, pids, per-run secrets

    @classmethod
    def under(cls, root: Path) -> Home:
        root = root.expanduser().absolute()
        return cls(etc=root / "etc", var=root / "var", run=root / "run")

    @classmethod
    def system(cls) -> Home:
        """root's default: the FHS places, named by ``/etc/letsinfer``."""
        return cls(
            etc=Path("/etc/letsinfer"), var=Path("/var/lib/letsinfer"), run=Path("/run/letsinfer")
        )

    @classmethod
    def user(cls) -> Home:
        """An ordinary user's default: one directory under ~/.local/share."""
        data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share")
        return cls.under(data / "letsinfer")

    @classmethod
    def resolve(cls, explicit: str | Path | None = None) -> Home:
        """``--home DIR`` (or LETSINFER_HOME) means what :attr:`label` shows:
        a directory holding etc, var and run, or ``/etc/letsinfer`` for
        root's FHS places; without one, the default for this user."""
        chosen = explicit or os.environ.get(HOME_ENV)
        if chosen:
            system = cls.system()
            if Path(chosen).expanduser().absolute() == system.etc:
                return system
            return cls.under(Path(chosen))
        return cls.system() if os.geteuid() == 0 else cls.user()

    @property
    def label(self) -> str:
        """How messages name this home, and what ``--home`` accepts for it: DIR
        for ``--home DIR``, the config directory (``/etc/letsinfer``) for
        root's defaults."""
        root = self.etc.parent
        if self.etc.name == "etc" and self.var == root / "var" and self.run == root / "run":
            return str(root)
        return str(self.etc)

    def paths(self) -> dict[str, str]:
        return {"etc": str(self.etc), "var": str(self.var), "run": str(self.run)}

    @property
    def config_file(self) -> Path:
        return self.etc / "config.toml"

    @property
    def identity_file(self) -> Path:
        return self.etc / "node.json"

    @property
    def database(self) -> Path:
        return self.var / "authority.db"

    @property
    def requests_database(self) -> Path:
        """Per-request records (the main's gateway): apart from the authority."""
        return self.var / "requests.db"

    @property
    def model_store(self) -> Path:
        return self.var / "models"

    @property
    def downloads(self) -> Path:
        """``model pull``'s partial downloads, named by the sha256 they must have:
        never part of the model store until verified."""
        return self.var / "downloads"

    @property
    def engine_logs(self) -> Path:
        return self.var / "logs" / "engines"

    @property
    def engine_run(self) -> Path:
        return self.run / "engines"

    @property
    def pki(self) -> Path:
        """This node's own key and pairing certificate: never leave the home."""
        return self.etc / "pki"

    @property
    def audit_head(self) -> Path:
        """The audit chain's head signed with the node key: under etc, apart from
        the database, where a writer of the database alone cannot reach it."""
        return self.etc / "audit" / "head.json"

    @property
    def node_key(self) -> Path:
        return self.pki / "node.key"

    @property
    def pairing_cert(self) -> Path:
        return self.pki / "pairing.crt"

    def cluster_dir(self, cluster: str) -> Path:
        """CA and node certificate for one cluster. Moving to another cluster
        writes a new directory and then switches node.json: one atomic step."""
        return self.etc / "clusters" / cluster[:16]

    @property
    def ca_key(self) -> Path:  # main only
        return self.etc / "ca" / "ca.key"

    @property
    def enrollment_dir(self) -> Path:
        """Pending enrollment requests a candidate has received."""
        return self.var / "enrollment"

    @property
    def move_window(self) -> Path:
        """Set by `node move-into`: which other main may adopt this node, until when."""
        return self.var / "move-into.json"

    @property
    def controller_dir(self) -> Path:
        """On an operator's workstation: the controller key and certificate."""
        return self.etc / "controller"

    @property
    def revoked_certificates(self) -> Path:
        """On a child: the fingerprints its main has revoked, refused by its agent."""
        return self.var / "revoked-certificates.json"

    @property
    def admin_socket(self) -> Path:
        return self.run / "admin.sock"

    @property
    def pid_file(self) -> Path:
        return self.run / "node.pid"

    def running_pid(self) -> int | None:
        """The pid of the node running on this home (it holds the pid file's
        lock), -1 when one runs but its pid cannot be read, None when none runs."""
        try:
            fh = self.pid_file.open()
        except FileNotFoundError:
            return None
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = fh.read().strip()
                return int(text) if text.isdigit() else -1
            fcntl.flock(fh, fcntl.LOCK_UN)
        return None

    @property
    def handover_request(self) -> Path:
        """Written by `service restart`: the node it names leaves its engines running."""
        return self.run / "handover.json"

    def ensure(self) -> None:
        """Create the directories. Where the ``letsinfer`` group exists, its
        members may enter etc (to read node.json and config.toml; every key
        and secret in there stays owner-only) and run (the admin socket);
        otherwise both are owner-only."""
        gid = admin_gid()
        for path, mode in (
            (self.etc, 0o750 if gid is not None else 0o700),
            (self.var, 0o755),
            (self.run, 0o750 if gid is not None else 0o700),
            (self.model_store, 0o755),
            (self.engine_logs, 0o750),
            (self.engine_run, 0o700),
        ):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(mode)
        self.share()

    def ensure_run(self) -> None:
        """The run directory (a tmpfs: gone after a reboot) as ensure() makes it."""
        if not self.run.exists():
            self.run.mkdir(parents=True)
            self.run.chmod(0o700)
        self.share()

    def share(self) -> None:
        """Let the ``letsinfer`` group, where it exists, use this home's CLI:
        enter etc and run, read node.json and config.toml, read and write the
        databases. Never a key or a secret (those stay 0600). Run at every
        start, so a group made after the node was set up takes effect then.
        Only widens, and only what this process owns."""
        gid = admin_gid()
        if gid is None:
            return
        for path, mode in (
            (self.etc, 0o750),
            (self.run, 0o750),
            (self.identity_file, 0o640),
            (self.config_file, 0o640),
            (self.database, 0o660),
            (self.requests_database, 0o660),
        ):
            try:
                st = path.stat()
            except OSError:
                continue
            if st.st_uid != os.geteuid():
                continue
            share_with_group(path, gid)
            path.chmod((st.st_mode & 0o777) | mode)


def admin_gid() -> int | None:
    """The ``letsinfer`` group's id, or None where it does not exist."""
    try:
        return grp.getgrnam(ADMIN_GROUP).gr_gid
    except KeyError:
        return None


def share_with_group(path: Path, gid: int | None) -> None:
    """Give ``path`` the ``letsinfer`` group (its mode says what the group may)."""
    if gid is None:
        return
    with contextlib.suppress(PermissionError):  # only root (or a member) may
        os.chown(path, -1, gid)
