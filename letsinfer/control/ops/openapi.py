"""The admin API's OpenAPI 3.1 document, generated from its routes: what
docs/admin-api.openapi.json holds (`./dev openapi` writes it) and what the
control plane serves to controllers at /v1/ops/openapi.json. The gateway's
OpenAI surface is not in it; nor are the nodes' and the open pairing paths."""

import json
from functools import cache
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI
from fastapi.routing import APIRoute

from letsinfer import __version__
from letsinfer.control.ops import admin_routers
from letsinfer.control.ops.context import OpsContext
from letsinfer.control.ops.rollouts import NoRollouts

DOCUMENT = Path(__file__).resolve().parents[3] / "docs" / "admin-api.openapi.json"
PATH = "/v1/ops/openapi.json"

_DESCRIPTION = (
    "Operations on a letsinfer main, for paired controllers (mutual TLS; the role is in "
    "the controller's certificate: viewer < operator < administrator). Each operation "
    "names the role it needs; a refusal is 403 and is audited on the main under the "
    'controller\'s identity. Errors are {"error": {"message", "code"}}. See '
    "docs/admin-api.md."
)


@cache
def admin_openapi() -> dict[str, Any]:
    """Built from the routes alone: nothing they would touch is needed."""
    app = FastAPI(
        title="letsinfer admin API",
        version=__version__,
        description=_DESCRIPTION,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    nothing = cast(Any, None)  # the routes read these only when called
    parts = admin_routers(OpsContext(nothing, nothing), NoRollouts())
    for part in parts:
        app.include_router(part)
    document = app.openapi()
    for route in (r for part in parts for r in part.routes):
        if isinstance(route, APIRoute):
            roles = [d.call.role for d in route.dependant.dependencies if hasattr(d.call, "role")]
            for method in route.methods:
                operation = document["paths"][route.path_format][method.lower()]
                operation["x-letsinfer-role"] = roles[0]
                operation["description"] = (
                    f"{operation.get('description', '')}\n\nNeeds the {roles[0]} role."
                ).strip()
    document["paths"][PATH] = {
        "get": {
            "summary": "This document",
            "operationId": "admin_openapi",
            "tags": ["state"],
            "x-letsinfer-role": "viewer",
            "description": "Needs the viewer role.",
            "responses": {"200": {"description": "The admin API's OpenAPI document"}},
        }
    }
    return document


def rendered() -> str:
    return json.dumps(admin_openapi(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # `./dev openapi`
    DOCUMENT.write_text(rendered())
    print(f"wrote {DOCUMENT}")
