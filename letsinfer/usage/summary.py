"""`letsinfer usage` as data: requests and tokens summed per key, model, node,
tag or project from the main's request records. The CLI on the main and the admin API (a
controller's `letsinfer usage`) both answer with this, so they print the same."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from letsinfer.store.records import ApiKeyRecord
from letsinfer.store.requests import RequestStore

USAGE_COLUMNS = ["requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens"]


class NoRecords(LookupError):
    """The main has written no request records yet."""


def open_records(path: Path) -> RequestStore:
    if not path.exists():
        raise NoRecords(
            "no request records on this node yet (the gateway writes them as it answers)"
        )
    return RequestStore(path, readonly=True)


SummedBy = Literal["key", "model", "node", "tag", "project"]
# An API key as the authority holds it, revoked ones too: (name, created,
# revoked or None, project or None). A project's requests are its keys'.
KeySpan = tuple[str, float, float | None, str | None]


def key_spans(keys: Iterable[ApiKeyRecord]) -> list[KeySpan]:
    return [(k.name, k.created_at, k.revoked_at, k.project) for k in keys]


def usage_rows(
    records: Path,
    by: SummedBy,
    since: float | None,
    node_names: Callable[[], dict[str, str]],
    keys: Callable[[], list[KeySpan]] = list,
) -> list[dict[str, Any]]:
    """``node_names``: node id -> name, asked only when summing by node;
    ``keys``: every key the authority has had, asked only by project."""
    store = open_records(records)
    try:
        sums = store.usage_by_project(keys(), since) if by == "project" else store.usage(by, since)
    finally:
        store.close()
    names = node_names() if by == "node" else {}
    return [
        {
            by: names.get(u.name, u.name),
            "requests": u.requests,
            "errors": u.errors,
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        }
        for u in sums
    ]


class NoSuchRequest(LookupError):
    """No record of that request id (never made, not written yet, or expired)."""


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def request_rows(
    records: Path,
    request_id: str,
    node_names: Callable[[], dict[str, str]],
    keep_days: Callable[[], int],
) -> list[dict[str, Any]]:
    """`letsinfer request ID` as data: one row per request that carried the id
    (a client may reuse its ids)."""
    store = open_records(records)
    try:
        found = store.find(request_id)
    finally:
        store.close()
    if not found:
        raise NoSuchRequest(
            f"no record of request {request_id!r} (records are kept {keep_days()} days and "
            "written about a second after the answer)"
        )
    names = node_names()
    return [
        {
            "request_id": r.request_id,
            "time": when(r.ts),
            "key": r.key,
            "model": r.model,
            "placement_group": r.pg,
            "node": names.get(r.node, r.node) if r.node else None,
            "endpoint": r.endpoint,
            "stream": r.stream,
            "status": r.status,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            # An answer from the cache costs nothing; a request that reported no
            # usage (a stream its client cut) was charged this estimate instead.
            "cached": r.cached,
            "charged_tokens": r.charged,
            "tags": json.loads(r.tags) if r.tags else [],
            "ttft_ms": None if r.ttft_ms is None else round(r.ttft_ms, 2),
            "duration_ms": round(r.duration_ms, 2),
            "queue_ms": round(r.queue_ms, 2),
            # It found its model unloaded and waited this long for the load
            # (part of queue_ms); null: it did not wait for a load.
            "load_wait_ms": None if r.load_wait_ms is None else round(r.load_wait_ms, 2),
        }
        for r in found
    ]
