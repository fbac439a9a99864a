"""LoRA adapters by name: the request's own bytes with llama.cpp's ``lora`` field.

A base model's engines load every adapter of that model at start, unapplied
(scale 0). A request that names an adapter as its model reaches one of the base
model's groups that loaded it, with ``"lora": [{"id": N, "scale": 1.0}]``
where N is the adapter's place in that engine's list: llama.cpp applies it to
that request alone.

Clients never choose adapters by id: a request that carries its own ``lora``
field is refused (otherwise a key allowed only the base model could apply any
adapter, past its allowlist).
"""

from __future__ import annotations

from letsinfer.gateway.errors import GatewayError

FIELD = "lora"


def with_lora(body: bytes, adapter_id: int) -> bytes:
    """The client's bytes with the field added in front (the body is a JSON
    object that was checked already, and has no ``lora`` of its own)."""
    start = body.find(b"{")
    field = b'"lora":[{"id":%d,"scale":1.0}],' % adapter_id
    return body[: start + 1] + field + body[start + 1 :]


def client_lora() -> GatewayError:
    return GatewayError(
        400,
        "The 'lora' field is set by the gateway: name a LoRA adapter as the model instead.",
        param=FIELD,
        code="invalid_value",
    )


def told_as(adapter: str, err: GatewayError) -> GatewayError:
    """Its base model's refusal (stopped, no replica, full, ...) as a client
    allowed only the adapter hears it: about the adapter, and nothing of the
    base or its groups (same status, code and Retry-After)."""
    return GatewayError(
        err.status,
        f"Model '{adapter}' cannot take requests right now ({err.code}).",
        type_=err.type,
        code=err.code,
        headers=err.headers,
    )
