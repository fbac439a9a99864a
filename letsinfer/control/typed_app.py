"""The FastAPI app every plane builds on (control, agent, admin sockets): one
error shape for all of them, and request bodies read within limits first
(letsinfer.bodylimits). Apart from the operations, so a child's agent builds
its apps without loading the main's."""

from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from letsinfer.bodylimits import BodyLimits


def typed_app(title: str, lifespan: Any = None) -> FastAPI:
    """A FastAPI app whose errors all have one shape: {"error": {message, code}}."""
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.add_middleware(BodyLimits)

    @app.exception_handler(HTTPException)
    async def _error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": exc.detail, "code": exc.status_code}},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Where and what, never the input: FastAPI's own answer repeats the
        # body once per wrong field, to anyone who can reach an open route.
        said = "; ".join(
            f"{'.'.join(str(part) for part in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
            for e in exc.errors()[:5]
        )
        return JSONResponse(
            {"error": {"message": f"invalid request: {said}"[:500], "code": 422}},
            status_code=422,
        )

    return app
