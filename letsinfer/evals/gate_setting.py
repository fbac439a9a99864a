"""A model's gate shown, set or cleared (``model gate``): one function for the
CLI on the main and the admin API, so both say and audit the same."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from letsinfer.evals.gate import GateSpec
from letsinfer.store import AuthorityStore, ServiceRecord


class GateRefused(Exception):
    """Nothing changed; ``missing``: there is no such model."""

    def __init__(self, message: str, missing: bool) -> None:
        super().__init__(message)
        self.missing = missing


def gated_model(store: AuthorityStore, name: str) -> ServiceRecord:
    svc = store.resolve_service(name)
    if svc is None:
        raise GateRefused(f"no model {name!r} (see `letsinfer model list`)", missing=True)
    if svc.external:
        raise GateRefused(f"model {svc.name} is external: it has no weights to gate", missing=False)
    return svc


def change_gate(
    store: AuthorityStore,
    name: str,
    spec: GateSpec | None,
    clear: bool,
    actor: str,
    role: str | None = None,
) -> dict[str, Any]:
    """Set ``spec``, clear (``clear``), or neither (show): the gate as kept
    after, and ``cleared`` (whether a clear removed one; None: no clear)."""
    svc = gated_model(store, name)
    cleared: bool | None = None
    if clear:
        with store.transaction():
            cleared = store.clear_gate(svc.name)
            # Audited even when there was none: every clear asked is on the record.
            store.append_audit(
                actor,
                "model.gate.clear",
                "ok",
                role=role,
                target=svc.name,
                detail=None if cleared else "had none",
            )
    elif spec is not None:
        with store.transaction():
            store.set_gate(svc.name, spec.suite, spec.min_score, actor)
            store.append_audit(
                actor,
                "model.gate.set",
                "ok",
                role=role,
                target=svc.name,
                detail=f"suite={spec.suite} min_score={spec.min_score:g}"[:1000],
            )
    kept = store.get_gate(svc.name)
    return {
        "model": svc.name,
        "suite": kept.suite if kept else None,
        "min_score": kept.min_score if kept else None,
        "set_at": datetime.fromtimestamp(kept.set_at, UTC).isoformat(timespec="seconds")
        if kept
        else None,
        "cleared": cleared,
    }
