"""The gateway's HTTP surface: thin handlers over directory, routing and upstream."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from letsinfer.gateway.availability import MEANT_TO_SERVE
from letsinfer.gateway.direct import protocol_mixin
from letsinfer.gateway.directory import KeyPolicy, ServiceEntry, StoreUnavailable
from letsinfer.gateway.errors import GatewayError, internal_error, unknown_model
from letsinfer.gateway.gateway import Gateway
from letsinfer.gateway.serving import (
    ROUTES,
    InferenceEndpoints,
    authenticate,
    count_refusal,
    note_refusal,
)

log = logging.getLogger("letsinfer.gateway")

__all__ = ["Gateway", "create_app", "direct_path"]


class _GatewayApp(FastAPI):
    """FastAPI for the small routes; the inference POSTs skip its routing and
    middleware and go straight to :class:`InferenceEndpoints` (hot path)."""

    inference: InferenceEndpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ROUTES:
            await self.inference(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def direct_path(app: FastAPI) -> tuple[type, ...]:
    """For the gateway's server (``protocol_mixins``, on uvicorn's httptools
    protocol): its connections answer the inference POSTs without ASGI
    (letsinfer.gateway.direct)."""
    if not isinstance(app, _GatewayApp):
        return ()
    return (protocol_mixin(app.inference),)


def create_app(
    gw: Gateway,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
    portal: ASGIApp | None = None,
) -> FastAPI:
    """``portal``: the pages under /ui/ (letsinfer.portal), mounted after
    every gateway route (the inference POSTs never reach the router at all)."""
    app = _GatewayApp(
        title="letsinfer gateway",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.gateway = gw
    app.inference = InferenceEndpoints(gw)
    for path in ROUTES:  # reached only by other methods: they get 405
        app.router.add_route(path, app.inference, methods=["POST"])

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return GatewayError(
            exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None
        ).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return internal_error().response()

    def ready(entry: ServiceEntry) -> int:
        if entry.base is None:
            return gw.routing.ready_count(entry.name)
        return sum(
            1 for r in gw.routing.replicas(entry.base) if not r.paused and entry.name in r.adapters
        )

    def model_state(entry: ServiceEntry) -> str:
        state = gw.availability.state(entry.serves)
        if state == "serving":
            loads = gw.availability.loads
            return "scaling" if loads is not None and loads.loading(entry.serves) else "loaded"
        return "loading" if state == "gap" else state

    def model_card(entry: ServiceEntry, policy: KeyPolicy) -> dict[str, object]:
        card: dict[str, object] = {
            "id": entry.name,
            "object": "model",
            "created": entry.created,
            "owned_by": "letsinfer",
            "aliases": list(entry.aliases),
            "ready_replicas": ready(entry),
            # loaded, loading, unloaded or scaling (or why it cannot serve):
            # a model at zero groups stays listed.
            "state": model_state(entry),
        }
        # A LoRA adapter of this model; named only to a key that may use it
        # (an adapter-only key's errors never name it either).
        if entry.base is not None and policy.allows(entry.base):
            card["parent"] = entry.base
        return card

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        try:
            policy = authenticate(gw, request.headers.get("authorization"))
        except GatewayError as err:
            note_refusal(gw, request.scope, "-", err)
            count_refusal(gw, request.scope, err)
            return err.response()
        data = [
            model_card(s, policy) for s in gw.directory.current().services if policy.allows(s.name)
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> Response:
        try:
            policy = authenticate(gw, request.headers.get("authorization"))
        except GatewayError as err:
            note_refusal(gw, request.scope, "-", err)
            count_refusal(gw, request.scope, err)
            return err.response()
        try:
            entry = gw.directory.current().names.get(model)
            if entry is None or not policy.allows(entry.name):
                raise unknown_model(model)
        except GatewayError as err:
            return err.response()
        return JSONResponse(model_card(entry, policy))

    @app.get("/health")
    async def health(request: Request) -> Response:
        """Without a key: only whether the gateway serves (no model names).
        With one: the readiness of that key's models, and the status is theirs.

        200 when every model meant to serve has a ready group. Models that
        are stopped, parked, or not placed (``--no-serve``) do not count: a
        load balancer must not drop the whole gateway for them. A stopped
        cluster serves nothing: 503 ``stopped``."""
        header = request.headers.get("authorization")
        try:
            snapshot = gw.directory.current()
            policy = authenticate(gw, header) if header else None
        except StoreUnavailable:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        except GatewayError as err:
            note_refusal(gw, request.scope, "-", err)
            count_refusal(gw, request.scope, err)
            return err.response()
        names = [s.name for s in snapshot.services if policy is None or policy.allows(s.name)]
        states = {name: gw.availability.state(name) for name in names}
        if snapshot.system_stopped:
            status = "stopped"
        else:
            meant = [n for n in names if states[n] in MEANT_TO_SERVE]
            status = "ok" if all(states[n] == "serving" for n in meant) else "degraded"
        body: dict[str, object] = {"status": status}
        if policy is not None:
            entries = {s.name: s for s in snapshot.services}
            body["models"] = {name: ready(entries[name]) for name in names}
            body["states"] = states
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    if portal is not None:
        app.mount("/ui", portal)
    return app
