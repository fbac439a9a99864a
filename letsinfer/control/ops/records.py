"""What the gateway answered: `letsinfer usage` and `letsinfer request` from a
controller, from the main's request records."""

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query

from letsinfer import config
from letsinfer.control.ops.answers import RequestRecord, UsageRow
from letsinfer.control.ops.context import OpsContext
from letsinfer.trust.peer import Peer
from letsinfer.usage.summary import (
    KeySpan,
    NoRecords,
    NoSuchRequest,
    key_spans,
    request_rows,
    usage_rows,
)


def records_router(ops: OpsContext) -> APIRouter:
    router = APIRouter(tags=["records"])
    store = ops.store

    def node_names() -> dict[str, str]:
        return {n.id: n.name for n in store.list_nodes(include_removed=True)}

    def keys() -> list[KeySpan]:
        return key_spans(store.list_api_keys(include_revoked=True))

    @router.get("/v1/ops/usage", response_model_exclude_unset=True)
    async def usage(
        p: Annotated[Peer, ops.need("viewer")],
        by: Literal["key", "model", "node", "tag", "project"] = "key",
        since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
    ) -> list[UsageRow]:
        """``since``: seconds since the epoch (the CLI turns --since into it)."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no request records")
        try:
            rows = usage_rows(ops.home.requests_database, by, since, node_names, keys)
        except NoRecords as exc:
            raise HTTPException(404, str(exc)) from exc
        return [UsageRow.model_validate(r) for r in rows]

    @router.get("/v1/ops/requests/{request_id:path}")
    async def request(
        request_id: Annotated[str, Path(max_length=200)], p: Annotated[Peer, ops.need("viewer")]
    ) -> list[RequestRecord]:
        """Every record of requests that carried this id (a client may reuse ids)."""
        home = ops.home
        if home is None:
            raise HTTPException(503, "this plane has no request records")

        def keep_days() -> int:
            try:
                return config.load(home.config_file).requests.keep_days
            except config.ConfigError:
                return config.RequestSettings().keep_days

        try:
            rows = request_rows(home.requests_database, request_id, node_names, keep_days)
        except (NoRecords, NoSuchRequest) as exc:
            raise HTTPException(404, str(exc)) from exc
        return [RequestRecord.model_validate(r) for r in rows]

    return router
