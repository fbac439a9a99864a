"""The authority's SQLite store: the only package that writes SQL."""

from letsinfer.store.authority import (
    ApiKeyRecord,
    AuditRecord,
    AuthorityStore,
    ControllerRecord,
    EnrollmentRecord,
    LinkRecord,
    NodeRecord,
    PgTaskRecord,
    PlacementGroupRecord,
    ReleaseHistoryRecord,
    ServiceRecord,
    StoreError,
    TaskSpec,
)

__all__ = [
    "ApiKeyRecord",
    "AuditRecord",
    "AuthorityStore",
    "ControllerRecord",
    "EnrollmentRecord",
    "LinkRecord",
    "NodeRecord",
    "PgTaskRecord",
    "PlacementGroupRecord",
    "ReleaseHistoryRecord",
    "ServiceRecord",
    "StoreError",
    "TaskSpec",
]
