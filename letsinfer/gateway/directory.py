"""The gateway's in-memory view of keys and models, refreshed from the authority.

Requests never read the database: a background refresh swaps in new
immutable snapshots. If the store cannot be read for longer than the allowed
staleness, requests get 503 (never a misleading 401).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from letsinfer.capacity.policy import ScalingPolicy
from letsinfer.gateway.admission import BANDS, STANDARD
from letsinfer.gateway.cache import CachePolicy
from letsinfer.gateway.limits import KeyLimits, counted_since
from letsinfer.gateway.providers import GROUP_PREFIX, ExternalModel
from letsinfer.store import ApiKeyRecord, AuthorityStore, ServiceRecord
from letsinfer.store.people import ProjectRecord

log = logging.getLogger("letsinfer.gateway")

BAND_NAMES = ("interactive", "standard", "batch")  # index: the admission queue's band
assert len(BAND_NAMES) == BANDS


@dataclass(frozen=True)
class KeyPolicy:
    name: str
    digest: str  # the key's own (its name can be given to a new key once it is revoked)
    models: frozenset[str]  # canonical names; empty means every model
    concurrency: int | None
    band: int = STANDARD  # its turn in the admission queue (0 first)
    limits: KeyLimits | None = None  # None: no rate limit or budget (nothing counted)
    cache: CachePolicy | None = None  # None: its answers are never cached
    # Its project's shared limits, counted under PROJECT_SCOPE + the project's
    # name; None: no project, or one without limits (nothing more counted).
    project_scope: str | None = None

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models

    @classmethod
    def from_record(cls, k: ApiKeyRecord, project: ProjectRecord | None = None) -> KeyPolicy:
        limits = KeyLimits(k.rpm, k.tpm, k.budget_tokens, k.budget_period)
        models, band = frozenset(k.models), k.band
        scope = None
        if project is not None:
            if project.models:  # the project's models bound the key's
                models = models & frozenset(project.models) if models else frozenset(project.models)
                models = models or frozenset({""})  # (nothing left: no model, not every one)
            band = project.band or band
            shared = project_limits(project)
            scope = PROJECT_SCOPE + project.name if shared is not None else None
        return cls(
            k.name,
            k.digest,
            models,
            k.concurrency,
            BAND_NAMES.index(band) if band in BAND_NAMES else STANDARD,
            limits if limits.any else None,
            CachePolicy(k.cache_ttl_s, k.cache_sampled) if k.cache_ttl_s else None,
            scope,
        )


# A project's counts in the limiter, beside its keys' (no key name has a ':').
PROJECT_SCOPE = "project:"


def project_limits(project: ProjectRecord) -> KeyLimits | None:
    limits = KeyLimits(project.rpm, project.tpm, project.budget_tokens, project.budget_period)
    return limits if limits.any else None


def _project_scopes(
    store: AuthorityStore, projects: Iterable[ProjectRecord]
) -> dict[str, tuple[KeyLimits, frozenset[str]]]:
    """Each project with limits, as PROJECT_SCOPE + name: its limits, and the
    names of its keys whose records its counts are rebuilt from. Keys revoked
    since the counted time began, or of a suspended account, are among them:
    what they spent is still the project's after a restart."""
    now = time.time()
    since: dict[str, tuple[KeyLimits, float]] = {}
    for p in projects:
        shared = project_limits(p)
        if shared is not None:
            since[p.name] = (shared, counted_since(shared, now))
    if not since:
        return {}
    names: dict[str, set[str]] = {name: set() for name in since}
    for project, key, revoked in store.project_keys(min(s for _, s in since.values())):
        if project in since and (revoked is None or revoked >= since[project][1]):
            names[project].add(key)
    return {
        PROJECT_SCOPE + name: (shared, frozenset(names[name]))
        for name, (shared, _) in since.items()
    }


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    created: int
    aliases: tuple[str, ...]
    groups: int = 0  # placement groups it has (an external model: its one)
    running: frozenset[str] = frozenset()  # those an administrator wants running
    external: ExternalModel | None = None  # a provider instead of groups
    fallback: str | None = None  # answers when no group of this one can
    base: str | None = None  # a LoRA adapter: the model whose groups serve it
    # What answers under the name: the weights' digest (an adapter's, with its
    # base's), or the provider's URL and model name. A name reused for other
    # weights is another model (the response cache keys on it).
    identity: str = ""
    # Known to read text only: a GGUF model runs on llama.cpp without a vision
    # or audio projector (as do its adapters), so an image or audio part is
    # refused before its engine (protocol.refuse_media).
    text_only: bool = False
    # Its scaling policy when not the default (letsinfer.capacity): loaded on
    # demand, or kept at a number of groups by load.
    scaling: ScalingPolicy | None = None
    # Its canary (letsinfer.lifecycle.canary): the group and the share (0..1)
    # of its requests that group takes.
    canary: tuple[str, float] | None = None

    @property
    def serves(self) -> str:
        """The model whose replicas answer (the base, for an adapter)."""
        return self.base or self.name


@dataclass(frozen=True)
class Snapshot:
    keys: dict[str, KeyPolicy] = field(default_factory=dict)  # sha256 hex -> policy
    # name, alias or adapter -> its entry
    names: dict[str, ServiceEntry] = field(default_factory=dict)
    services: tuple[ServiceEntry, ...] = ()  # models and adapters, as /v1/models lists them
    system_stopped: bool = False  # `letsinfer cluster stop`
    # Each project with limits: (its limits, its keys' names), as PROJECT_SCOPE + name.
    projects: dict[str, tuple[KeyLimits, frozenset[str]]] = field(default_factory=dict)

    def externals(self) -> dict[str, ExternalModel]:
        """The external models to publish (not those stopped)."""
        return {s.name: s.external for s in self.services if s.external is not None and s.running}

    def canaries(self) -> dict[str, tuple[str, float]]:
        """Models with a canary: its group and share (for the routing table)."""
        return {s.name: s.canary for s in self.services if s.canary is not None}


def _running(service: ServiceRecord, groups: list[tuple[str, str]]) -> frozenset[str]:
    """A model's :attr:`ServiceEntry.running`: an external model is its one
    group (letsinfer.gateway.external), running unless stopped."""
    if service.external:
        return frozenset() if service.external_stopped else frozenset({GROUP_PREFIX + service.name})
    return frozenset(pg for pg, want in groups if want == "running")


def _identity(service: ServiceRecord) -> str:
    """A model's :attr:`ServiceEntry.identity`."""
    ext = service.external
    return service.artifact_digest or (f"{ext['url']} {ext['provider_model']}" if ext else "")


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
        # Told of each new snapshot (external models, key limits); not per request.
        self._listeners: list[Callable[[Snapshot], None]] = []

    def subscribe(self, listener: Callable[[Snapshot], None]) -> None:
        self._listeners.append(listener)
        if self._snapshot is not None:
            listener(self._snapshot)

    def refresh(self, force: bool = False) -> None:
        """Reload when keys, models, groups' desired state or the cluster-stop
        record changed (the store's ``directory`` revision, whoever wrote it:
        the nodes' facts never move it), and at least every third of the
        staleness bound (so a dead store is noticed). ``force``: reload now.
        Called on the gateway's loop only (a main's control thread posts its
        changes there), with that loop's store connection."""
        store = self.store
        try:
            version = store.revisions()["directory"]
            fresh = time.monotonic() - self._loaded_at < self.max_stale_s / 3
            if not force and self._snapshot is not None and version == self._version and fresh:
                return
            projects = {p.name: p for p in store.list_projects()}
            refused = store.unusable_owners()  # (suspended: refused from this snapshot on)
            keys = {
                k.digest: KeyPolicy.from_record(k, projects.get(k.project) if k.project else None)
                for k in store.list_api_keys()
                if k.owner is None or k.owner not in refused
            }
            scoped = _project_scopes(store, projects.values())
            scaling = store.scaling_policies()
            canaries = {c.service: (c.pg_id, c.percent / 100) for c in store.list_canaries()}
            groups: dict[str, list[tuple[str, str]]] = {}
            for pg in store.list_placement_groups():
                groups.setdefault(pg.service, []).append((pg.id, pg.desired))
            models = tuple(
                ServiceEntry(
                    s.name,
                    int(s.created_at),
                    s.aliases,
                    len(groups.get(s.name, [])) if not s.external else 1,
                    _running(s, groups.get(s.name, [])),
                    ExternalModel.from_record(s.external) if s.external else None,
                    s.fallback,
                    identity=_identity(s),
                    text_only=s.format == "gguf",
                    scaling=scaling.get(s.name),
                    canary=canaries.get(s.name),
                )
                for s in store.list_services()
            )
            weights = {m.name: m.identity for m in models}
            text_only = {m.name for m in models if m.text_only}
            adapters = tuple(
                ServiceEntry(
                    a.name,
                    int(a.created_at),
                    (),
                    fallback=a.fallback,
                    base=a.service,
                    identity=f"{a.artifact_digest} on {weights.get(a.service, '')}",
                    text_only=a.service in text_only,
                )
                for a in store.list_adapters()
            )
            services = tuple(sorted((*models, *adapters), key=lambda e: e.name))
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
        snapshot = Snapshot(
            keys=keys, names=names, services=services, system_stopped=stopped, projects=scoped
        )
        self._snapshot = snapshot
        self._version = version
        self._loaded_at = time.monotonic()
        self.failing = None
        for listener in self._listeners:
            listener(snapshot)

    def current(self) -> Snapshot:
        snap = self._snapshot
        if snap is None or time.monotonic() - self._loaded_at > self.max_stale_s:
            raise StoreUnavailable(self.failing or "not loaded")
        return snap

    def key_for(self, secret: str) -> KeyPolicy | None:
        return self.current().keys.get(hashlib.sha256(secret.encode()).hexdigest())
