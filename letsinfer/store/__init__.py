"""The authority's SQLite store: the only package that writes SQL."""

from letsinfer.store.adapters import AdapterRecord
from letsinfer.store.audit import AuditRecord, ChainTail, Denial, HeadKeeper
from letsinfer.store.authority import (
    ApiKeyRecord,
    AuthorityStore,
    ControllerRecord,
    EnrollmentRecord,
    FactsUpdate,
    GpuClaim,
    LinkRecord,
    NodeEntry,
    NodeRecord,
    PgTaskRecord,
    PlacementGroupRecord,
    ReleaseHistoryRecord,
    ServiceRecord,
    StoreError,
    TaskSpec,
    Witness,
)

__all__ = [
    "AdapterRecord",
    "ApiKeyRecord",
    "AuditRecord",
    "AuthorityStore",
    "ChainTail",
    "ControllerRecord",
    "Denial",
    "EnrollmentRecord",
    "FactsUpdate",
    "GpuClaim",
    "HeadKeeper",
    "LinkRecord",
    "NodeEntry",
    "NodeRecord",
    "PgTaskRecord",
    "PlacementGroupRecord",
    "ReleaseHistoryRecord",
    "ServiceRecord",
    "StoreError",
    "TaskSpec",
    "Witness",
]
