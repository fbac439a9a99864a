"""OpenAI-shaped error bodies, so unmodified clients raise the right exception."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import Response

from letsinfer.bounded_text import bounded

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()

    def response(self, request_id: str | None = None) -> Response:
        headers = dict(self.headers)
        if request_id:
            headers["x-request-id"] = request_id
        return Response(
            self.body(), status_code=self.status, media_type="application/json", headers=headers
        )

    async def send(self, send: Send, request_id: str) -> None:
        """Answer with this error straight over ASGI (the inference fast path)."""
        body = self.body()
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": self.head(body, request_id),
            }
        )
        await send({"type": "http.response.body", "body": body})

    def head(self, body: bytes, request_id: str) -> list[tuple[bytes, bytes]]:
        """The headers of this error's answer (``body``: :meth:`body`)."""
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()),
        ]
        headers += [(k.encode(), v.encode()) for k, v in self.headers.items()]
        return headers


def internal_error() -> GatewayError:
    return GatewayError(
        500,
        "The gateway failed unexpectedly; see its log.",
        type_="server_error",
        code="internal_error",
    )


def invalid_key() -> GatewayError:
    # Unknown and revoked keys get the same answer: nothing to probe.
    return GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")


def missing_key() -> GatewayError:
    return GatewayError(
        401, "Missing API key: send 'Authorization: Bearer <key>'.", code="invalid_api_key"
    )


def unknown_model(name: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model '{bounded(name, 128)}' does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


def no_replica(name: str, detail: str) -> GatewayError:
    return GatewayError(
        503,
        f"Model '{name}' has no healthy replica right now ({detail}); retry shortly.",
        type_="service_unavailable",
        code="no_healthy_replica",
        headers={"retry-after": "1"},
    )


def adapter_not_loaded(adapter: str, model: str) -> GatewayError:
    return GatewayError(
        503,
        f"LoRA adapter '{adapter}' is not loaded by any ready group of model '{model}' "
        "right now (groups load a model's adapters when they start); retry shortly.",
        type_="service_unavailable",
        code="no_healthy_replica",
        headers={"retry-after": "1"},
    )


def upstream_timeout(name: str) -> GatewayError:
    return GatewayError(
        504, f"Model '{name}' did not answer in time.", type_="timeout", code="upstream_timeout"
    )


def upstream_failed(name: str, detail: str) -> GatewayError:
    return GatewayError(
        502,
        f"Model '{name}' failed while answering: {detail}.",
        type_="server_error",
        code="upstream_error",
    )


# What a request's body holds, by endpoint: the param a refusal of its size names.
_INPUT_PARAM = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
}


def engine_refusal(name: str, status: int, body: bytes, path: str) -> GatewayError:
    """A local engine's 4xx answer (llama.cpp's own shape) as OpenAI's: the
    client's error, with the engine's reason. A prompt too long for the
    context is ``context_length_exceeded``. The engine refusing the gateway's
    own key is no fault of the client's: 502."""
    if status in (401, 403):
        return upstream_failed(name, f"its engine refused the gateway's key ({status})")
    try:
        error = json.loads(body)["error"]
        reason = str(error["message"])
        kind = error.get("type")
    except (ValueError, KeyError, TypeError):
        error, reason, kind = {}, body.decode("utf-8", "replace"), None
    if kind == "exceed_context_size_error":
        given, context = error.get("n_prompt_tokens"), error.get("n_ctx")
        if isinstance(given, int) and isinstance(context, int):
            reason = (
                f"this request is {given} tokens long and model '{name}' reads at most "
                f"{context} tokens at once; shorten it"
            )
        return GatewayError(
            status,
            f"The request is too long: {bounded(reason.rstrip('.'), 500)}.",
            code="context_length_exceeded",
            param=_INPUT_PARAM.get(path),
        )
    reason = bounded(reason.strip().rstrip("."), 500) or f"status {status}"
    return GatewayError(
        status, f"Model '{name}' refused the request: {reason}.", code="engine_refused"
    )


# Not a gap to wait out: no Retry-After, and the message says what ends it.
def model_parked(name: str, reasons: dict[str, str]) -> GatewayError:
    why = "; ".join(f"{pg}: {reason}" for pg, reason in reasons.items())
    return GatewayError(
        503,
        f"Model '{name}' is parked: its engine kept failing to start and is not "
        f"restarted ({why}). An administrator must fix it and run "
        f"`letsinfer model start {name}`.",
        type_="service_unavailable",
        code="model_parked",
    )


def model_stopped(name: str) -> GatewayError:
    return GatewayError(
        503,
        f"Model '{name}' is stopped by an administrator (`letsinfer model start {name}` "
        "starts it).",
        type_="service_unavailable",
        code="model_stopped",
    )


def model_not_placed(name: str) -> GatewayError:
    return GatewayError(
        503,
        f"Model '{name}' is not placed on any node yet (`letsinfer model install {name}`).",
        type_="service_unavailable",
        code="model_not_placed",
    )


def system_stopped() -> GatewayError:
    return GatewayError(
        503,
        "The cluster is stopped by an administrator (`letsinfer cluster start` starts it).",
        type_="service_unavailable",
        code="system_stopped",
    )
