"""The gateway's in-memory view of keys and models, refreshed from the authority.

Requests never read the database: a background refresh swaps in new
immutable snapshots. If the store cannot be read for longer than the allowed
staleness, requests get 503 (never a misleading 401).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field

from letsinfer.store import AuthorityStore

log = logging.getLogger("letsinfer.gateway")


@dataclass(frozen=True)
class KeyPolicy:
    name: str
    models: frozenset[str]  # canonical names; empty means every model
    concurrency: int | None

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    created: int
    aliases: tuple[str, ...]
    groups: int = 0  # placement groups it has
    running: frozenset[str] = frozenset()  # those an administrator wants running


@dataclass(frozen=True)
class Snapshot:
    keys: dict[str, KeyPolicy] = field(default_factory=dict)  # sha256 hex -> policy
    names: dict[str, ServiceEntry] = field(default_factory=dict)  # name or alias -> service
    services: tuple[ServiceEntry, ...] = ()
    system_stopped: bool = False  # `letsinfer cluster stop`


class StoreUnavailable(Exception):
    pass


class Directory:
    def __init__(self, store: AuthorityStore, max_stale_s: float = 30.0) -> None:
        self.store = store
        self.max_stale_s = max_stale_s
        self._snapshot: Snapshot | None = None
        self._loaded_at = 0.0
        self._version: int | None = None
        self.failing: str | None = None
        self._lock = threading.Lock()  # one reload at a time (a main refreshes from two threads)

    def refresh(self, force: bool = False, store: AuthorityStore | None = None) -> None:
        """Reload when keys, models, groups' desired state or the cluster-stop
        record changed (the store's ``directory`` revision, whoever wrote it:
        the nodes' facts never move it), and at least every third of the
        staleness bound (so a dead store is noticed). ``force``: reload now.
        ``store``: the calling thread's own connection (default: the one given)."""
        with self._lock:
            self._refresh(force, store or self.store)

    def _refresh(self, force: bool, store: AuthorityStore) -> None:
        try:
            version = store.revisions()["directory"]
            fresh = time.monotonic() - self._loaded_at < self.max_stale_s / 3
            if not force and self._snapshot is not None and version == self._version and fresh:
                return
            keys = {
                k.digest: KeyPolicy(k.name, frozenset(k.models), k.concurrency)
                for k in store.list_api_keys()
            }
            groups: dict[str, list[tuple[str, str]]] = {}
            for pg in store.list_placement_groups():
                groups.setdefault(pg.service, []).append((pg.id, pg.desired))
            services = tuple(
                ServiceEntry(
                    s.name,
                    int(s.created_at),
                    s.aliases,
                    len(groups.get(s.name, [])),
                    frozenset(pg for pg, want in groups.get(s.name, []) if want == "running"),
                )
                for s in store.list_services()
            )
            stopped = store.cluster_stop() is not None
        except Exception as exc:  # any store failure: keep serving the last snapshot
            if self.failing is None:
                log.error("authority store unreadable: %s", exc)
            self.failing = str(exc)
            return
        names: dict[str, ServiceEntry] = {}
        for svc in services:
            names[svc.name] = svc
            for alias in svc.aliases:
                names.setdefault(alias, svc)
        self._snapshot = Snapshot(keys=keys, names=names, services=services, system_stopped=stopped)
        self._version = version
        self._loaded_at = time.monotonic()
        self.failing = None

    def current(self) -> Snapshot:
        snap = self._snapshot
        if snap is None or time.monotonic() - self._loaded_at > self.max_stale_s:
            raise StoreUnavailable(self.failing or "not loaded")
        return snap

    def key_for(self, secret: str) -> KeyPolicy | None:
        return self.current().keys.get(hashlib.sha256(secret.encode()).hexdigest())
