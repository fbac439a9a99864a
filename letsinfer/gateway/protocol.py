"""Wire checks for the OpenAI endpoints.

The gateway validates the fields it relies on and the common ones clients get
wrong, then forwards the client's original bytes: nothing is re-serialised.
Unknown fields pass through to the engine.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from letsinfer import jsondepth
from letsinfer.gateway.errors import GatewayError


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1)
    stream: bool = False
    user: str | None = None


class _Sampling(_Request):
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=1)  # llama.cpp's server returns one choice
    stop: str | list[str] | None = None
    seed: int | None = None
    stream_options: dict[str, Any] | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(_Request):
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None


def prompt_start(request: _Request, limit: int) -> str:
    """The first ``limit`` characters of what the model reads first: the
    messages in order (role and text), or the prompt. Feeds the routing's
    prefix-affinity hint; an embedding request has none."""
    if limit <= 0:
        return ""
    parts: list[str] = []
    size = 0
    if isinstance(request, ChatCompletionRequest):
        for message in request.messages:
            content = message.content
            if isinstance(content, list):  # content parts: their text, in order
                content = "".join(
                    str(p.get("text", "")) for p in content if p.get("type") == "text"
                )
            piece = f"{message.role}\n{content or ''}\n"
            parts.append(piece)
            size += len(piece)
            if size >= limit:
                break
    elif isinstance(request, CompletionRequest):
        prompt = request.prompt
        if isinstance(prompt, str):
            parts.append(prompt)
        elif prompt and isinstance(prompt[0], str):
            parts.append(str(prompt[0]))
        elif prompt:  # token ids
            first = prompt[0] if isinstance(prompt[0], list) else prompt
            parts.append(" ".join(str(t) for t in first[:limit]))
    return "".join(parts)[:limit]


def parse(body: bytes, model: type[_Request]) -> _Request:
    if jsondepth.too_deep(body):  # before the parser recurses into it
        raise GatewayError(400, jsondepth.too_deep_message(), code="json_too_deep")
    try:  # pydantic's own JSON parser: half the cost of json.loads, then validate
        return model.model_validate_json(body)
    except ValidationError:
        pass  # refused, or stricter than json (a lone surrogate): the path below decides
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GatewayError(400, f"The request body is not valid JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise GatewayError(400, "The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "missing":
            message = f"Missing required parameter: '{param}'."
        else:
            message = f"Invalid value for '{param}': {first['msg']}."
        raise GatewayError(400, message, param=param, code="invalid_value") from exc
