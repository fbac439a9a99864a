"""The gateway's HTTP surface: thin handlers over directory, routing and upstream."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from letsinfer.gateway import protocol
from letsinfer.gateway.directory import Directory, KeyPolicy, StoreUnavailable
from letsinfer.gateway.errors import GatewayError, invalid_key, missing_key, unknown_model
from letsinfer.gateway.routing import Replica, RoutingTable
from letsinfer.gateway.upstream import Upstream

access_log = logging.getLogger("letsinfer.access")
log = logging.getLogger("letsinfer.gateway")

_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass
class Gateway:
    directory: Directory
    routing: RoutingTable
    upstream: Upstream
    max_body_bytes: int


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id")
    if given and _SANE_REQUEST_ID.match(given):
        return given
    return uuid.uuid4().hex


def _authenticate(gw: Gateway, request: Request) -> KeyPolicy:
    header = request.headers.get("authorization")
    if not header:
        raise missing_key()
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise missing_key()
    try:
        policy = gw.directory.key_for(secret.strip())
    except StoreUnavailable as exc:
        raise GatewayError(
            503,
            "The gateway cannot check API keys right now (authority "
            "store unavailable); retry shortly.",
            type_="service_unavailable",
            code="authority_unavailable",
            headers={"retry-after": "2"},
        ) from exc
    if policy is None:
        raise invalid_key()
    return policy


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise GatewayError(400, "Invalid Content-Length header.")
        if int(declared) > limit:
            raise GatewayError(
                413,
                f"Request body is larger than the limit of {limit} bytes.",
                code="request_too_large",
            )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GatewayError(
                413,
                f"Request body is larger than the limit of {limit} bytes.",
                code="request_too_large",
            )
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(
    gw: Gateway,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
) -> FastAPI:
    app = FastAPI(
        title="letsinfer gateway",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.gateway = gw

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return GatewayError(
            exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None
        ).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return GatewayError(
            500,
            "The gateway failed unexpectedly; see its log.",
            type_="server_error",
            code="internal_error",
        ).response()

    async def serve(request: Request, path: str, schema: type[protocol._Request]) -> Response:
        request_id = _request_id(request)
        started = time.perf_counter()
        key_name = "-"
        asked = served = "-"

        def finish(status: int, replica: Replica | None) -> None:
            access_log.info(
                "request_id=%s key=%s model=%s served=%s pg=%s status=%d total_ms=%.1f",
                request_id,
                key_name,
                asked,
                served,
                replica.pg_id if replica else "-",
                status,
                (time.perf_counter() - started) * 1000,
            )

        try:
            policy = _authenticate(gw, request)
            key_name = policy.name
            body = await _read_body(request, gw.max_body_bytes)
            parsed = protocol.parse(body, schema)
            asked = parsed.model
            entry = gw.directory.current().names.get(parsed.model)
            if entry is None or not policy.allows(entry.name):
                raise unknown_model(parsed.model)
            served = entry.name
            return await gw.upstream.forward(
                entry.name, path, body, parsed.stream, request_id, finish
            )
        except GatewayError as err:
            finish(err.status, None)
            return err.response(request_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, "/v1/chat/completions", protocol.ChatCompletionRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, "/v1/completions", protocol.CompletionRequest)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await serve(request, "/v1/embeddings", protocol.EmbeddingRequest)

    def model_card(name: str, created: int, aliases: tuple[str, ...]) -> dict[str, object]:
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "letsinfer",
            "aliases": list(aliases),
            "ready_replicas": gw.routing.ready_count(name),
        }

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        try:
            policy = _authenticate(gw, request)
        except GatewayError as err:
            return err.response()
        data = [
            model_card(s.name, s.created, s.aliases)
            for s in gw.directory.current().services
            if policy.allows(s.name)
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> Response:
        try:
            policy = _authenticate(gw, request)
            entry = gw.directory.current().names.get(model)
            if entry is None or not policy.allows(entry.name):
                raise unknown_model(model)
        except GatewayError as err:
            return err.response()
        return JSONResponse(model_card(entry.name, entry.created, entry.aliases))

    @app.get("/health")
    async def health() -> Response:
        try:
            services = gw.directory.current().services
        except StoreUnavailable:
            return JSONResponse({"status": "unavailable", "models": {}}, status_code=503)
        models = {s.name: gw.routing.ready_count(s.name) for s in services}
        ok = all(models.values())
        return JSONResponse(
            {"status": "ok" if ok else "degraded", "models": models}, status_code=200 if ok else 503
        )

    return app
