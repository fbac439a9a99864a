"""The FastAPI app every plane builds on (control, agent admin socket): one
error shape for all of them. Apart from the operations, so a child's agent
builds its admin app without loading the main's."""

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from letsinfer.jsondepth import JsonDepthLimit


def typed_app(title: str) -> FastAPI:
    """A FastAPI app whose errors all have one shape: {"error": {message, code}}."""
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(JsonDepthLimit)

    @app.exception_handler(HTTPException)
    async def _error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": exc.detail, "code": exc.status_code}},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    return app
