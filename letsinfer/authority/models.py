"""Model services: the names clients use, and where they are placed."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from letsinfer.authority.modelstore import stage_gguf
from letsinfer.authority.refusals import audited
from letsinfer.contracts.artifacts import ModelFileError
from letsinfer.engines.releases import Release
from letsinfer.store import AuthorityStore, PlacementGroupRecord, ServiceRecord, StoreError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


class ModelRefused(StoreError):
    """The engine could not serve the file; nothing changed."""


def check_model_name(name: str) -> None:
    if not _NAME.fullmatch(name):  # (not match: its $ allows a newline at the end)
        raise StoreError(
            f"invalid model name {name!r}: use letters, digits and . _ : / - (at most 128)"
        )


def audit_target(name: str) -> str | None:
    """``name`` as an audit record's target: None when it is no valid name."""
    return name if _NAME.fullmatch(name) else None


def resolve_fallback(
    store: AuthorityStore, name: str, fallback: str, aliases: tuple[str, ...] = ()
) -> str:
    """The canonical name of a fallback: a model (or alias) or a LoRA adapter.
    ``aliases``: those of a model being added (not recorded yet)."""
    if fallback == name or fallback in aliases:
        raise StoreError(f"model {name} cannot be its own fallback")
    svc = store.resolve_service(fallback)
    target = svc.name if svc is not None else None
    if target is None and store.get_adapter(fallback) is not None:
        target = fallback
    if target is None:
        raise StoreError(f"fallback {fallback!r}: no such model (see `letsinfer model list`)")
    if target == name:
        raise StoreError(f"model {name} cannot be its own fallback")
    return target


@dataclass(frozen=True)
class FirstGroup:
    """Where a model being added starts serving: a node, its release, its GPUs."""

    node_id: str
    release: Release
    release_signature: str | None
    gpus: tuple[str, ...] = ()


def add_gguf_model(
    store: AuthorityStore,
    model_store: Path,
    name: str,
    source: Path,
    *,
    release: Release,
    place: Callable[[Path], Sequence[FirstGroup]] | None = None,
    aliases: tuple[str, ...] = (),
    actor: str = "cli",
    release_signature: str | None = None,
    origin: dict[str, Any] | None = None,
    prove: Callable[[Path, str], str | None] | None = None,
    known_good: bool = False,
    fallback: str | None = None,
) -> tuple[ServiceRecord, list[PlacementGroupRecord]]:
    """Check the file, plan where it serves (``place``, given the checked file:
    a StoreError from it refuses the model, before any engine loads it), prove it
    in ``release``'s engine (proof at the door: ``prove(file, kind)`` runs one
    completion, or one embedding, and returns why the engine could not, or None),
    store it, then record the service and its first PGs atomically. A refusal
    leaves the store and the authority as they were. ``place`` None: registered
    only. ``known_good``: letsinfer wrote the file itself (the tiny model), so
    no trial engine runs. ``origin`` (from ``model pull``) says where the file
    came from: repository, commit and the sha256 the hub published for each file."""
    with audited(store, actor, "model.add", audit_target(name)):
        check_model_name(name)
        for alias in aliases:
            check_model_name(alias)
        store.check_new_names(name, aliases)
        if fallback is not None:
            fallback = resolve_fallback(store, name, fallback, aliases)
    try:
        staged = stage_gguf(model_store, source)
    except ModelFileError as exc:  # audited like the engine's refusal below
        store.append_audit(actor, "model.add", "denied", target=name, detail=str(exc)[:1000])
        raise
    try:
        groups: Sequence[FirstGroup] = ()
        if place is not None:
            try:
                groups = place(staged.path)
            except StoreError as exc:
                store.append_audit(
                    actor, "model.add", "denied", target=name, detail=str(exc)[:1000]
                )
                raise
        refused = None if known_good or prove is None else prove(staged.path, staged.kind)
        if refused is not None:
            why = f"{release.id} could not serve {source}: {refused.rstrip('.')}"
            store.append_audit(actor, "model.add", "denied", target=name, detail=why[:1000])
            raise ModelRefused(f"model {name!r} refused: {why}. Nothing changed.")
        with store.transaction():
            store.ensure_release(
                release.id,
                release.engine,
                release.version,
                release.target,
                release.artifacts,
                release.launch,
                release_signature,
            )
            svc = store.add_service(
                name,
                staged.digest,
                staged.size,
                "gguf",
                _source_text(source, origin),
                aliases,
                origin,
                kind=staged.kind,
                fallback=fallback,
            )
            pgs = []
            for g in groups:  # serve it right away
                r = g.release
                store.ensure_release(
                    r.id, r.engine, r.version, r.target, r.artifacts, r.launch, g.release_signature
                )
                pgs.append(
                    store.add_placement_group(
                        f"pg-{uuid.uuid4().hex[:12]}", name, g.node_id, r.id, r.target, g.gpus
                    )
                )
            staged.commit()  # the file is in place before anyone reads the rows
            detail = f"sha256:{staged.digest}"
            if origin is not None:
                detail += f" from {origin['repo']}@{origin['commit']}"
            store.append_audit(actor, "model.add", "ok", target=name, detail=detail)
    except BaseException:
        staged.discard()
        raise
    return svc, pgs


def _source_text(source: Path, origin: dict[str, Any] | None) -> str:
    if origin is None:
        return str(source)
    return f"{origin['repo']}@{origin['commit']}:{origin['files'][0]['name']}"
