"""Wire checks for the OpenAI endpoints.

The gateway validates the fields it relies on and the common ones clients get
wrong, then forwards the client's original bytes: nothing is re-serialised.
Unknown fields pass through to the engine.

A request is validated into a plain dict (a ``TypedDict`` schema), not a
model instance per request and per message: half the cost on every
inference request (docs/benchmarks.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, with_config

# pydantic's own dependency; it reads TypedDicts from here before Python 3.12.
from typing_extensions import TypedDict

from letsinfer import jsondepth
from letsinfer.gateway.errors import GatewayError

# Unknown fields kept (they go to the engine), no coercion ("1" is not 1).
_CHECKED = ConfigDict(extra="allow", strict=True)


@with_config(_CHECKED)
class ChatMessage(TypedDict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: NotRequired[str | list[dict[str, Any]] | None]


@with_config(_CHECKED)
class Request(TypedDict):
    """What every route reads: the model, whether to stream, and the rest as sent."""

    model: Annotated[str, Field(min_length=1)]
    stream: NotRequired[bool]
    user: NotRequired[str | None]


@with_config(_CHECKED)
class _Sampling(Request):
    max_tokens: NotRequired[Annotated[int, Field(ge=1)] | None]
    max_completion_tokens: NotRequired[Annotated[int, Field(ge=1)] | None]
    temperature: NotRequired[Annotated[float, Field(ge=0, le=2)] | None]
    top_p: NotRequired[Annotated[float, Field(ge=0, le=1)] | None]
    # One answer per request: its usage, which every count relies on, covers one.
    n: NotRequired[Annotated[int, Field(ge=1, le=1)] | None]
    n_cmpl: NotRequired[Annotated[int, Field(ge=1, le=1)] | None]  # llama.cpp's own n
    n_predict: NotRequired[Annotated[int, Field(ge=-1)] | None]  # llama.cpp's max_tokens
    stop: NotRequired[str | list[str] | None]
    seed: NotRequired[int | None]
    stream_options: NotRequired[dict[str, Any] | None]


@with_config(_CHECKED)
class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]


@with_config(_CHECKED)
class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]


@with_config(_CHECKED)
class EmbeddingRequest(Request):
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: NotRequired[Literal["float", "base64"] | None]


Kind = Literal["chat", "completion", "embedding"]
# A checked body: the fields above, validated, and every other field as sent.
Body = dict[str, Any]


@dataclass(frozen=True, eq=False)
class Route:
    """One inference endpoint: what its body must be."""

    kind: Kind
    schema: TypeAdapter[Any]

    @property
    def sampling(self) -> bool:
        """A completion (chat or text): it has sampling parameters and may stream usage."""
        return self.kind != "embedding"


CHAT = Route("chat", TypeAdapter(ChatCompletionRequest))
COMPLETION = Route("completion", TypeAdapter(CompletionRequest))
EMBEDDING = Route("embedding", TypeAdapter(EmbeddingRequest))


def prompt_start(request: Body, kind: Kind, limit: int) -> str:
    """The first ``limit`` characters of what the model reads first: the
    messages in order (role and text), or the prompt. Feeds the routing's
    prefix-affinity hint; an embedding request has none."""
    if limit <= 0:
        return ""
    parts: list[str] = []
    size = 0
    if kind == "chat":
        for message in request["messages"]:
            content = message.get("content")
            if isinstance(content, list):  # content parts: their text, in order
                content = "".join(
                    str(p.get("text", "")) for p in content if p.get("type") == "text"
                )
            piece = f"{message['role']}\n{content or ''}\n"
            parts.append(piece)
            size += len(piece)
            if size >= limit:
                break
    elif kind == "completion":
        prompt = request["prompt"]
        if isinstance(prompt, str):
            parts.append(prompt)
        elif prompt and isinstance(prompt[0], str):
            parts.append(str(prompt[0]))
        elif prompt:  # token ids
            first = prompt[0] if isinstance(prompt[0], list) else prompt
            parts.append(" ".join(str(t) for t in first[:limit]))
    return "".join(parts)[:limit]


# Content parts a model needs a vision or audio projector for.
_MEDIA = {"image_url": "image", "input_audio": "audio"}
_MEDIA_PARTS = tuple(_MEDIA)


def may_carry_media(body: bytes) -> bool:
    """Whether a chat's raw body names an image or audio part at all: two
    searches in C, so that a plain text chat skips :func:`refuse_media`'s walk
    over its messages. (A body that spells the names with escapes is walked
    past here; its engine then refuses the part itself.)"""
    return b"image_url" in body or b"input_audio" in body


def refuse_media(request: Body, model: str) -> None:
    """Refuse (400) a chat with an image or audio part, for a model known to
    read text only: the client's error, said before any engine sees it. Only
    content given as a list of parts is looked into (plain text costs a
    check per message)."""
    for message in request["messages"]:
        content = message.get("content")
        if content.__class__ is not list:
            continue
        for part in content:
            given = part.get("type")
            if given in _MEDIA_PARTS:  # (compared, not hashed: any JSON value may be here)
                kind = _MEDIA[given]
                raise GatewayError(
                    400,
                    f"Model '{model}' reads text only: it cannot take {kind} input "
                    f"(a '{given}' content part). Send text, or use a model "
                    f"that reads {kind}.",
                    param="messages",
                    code="unsupported_content",
                )


def completion_limit(request: Body) -> int | None:
    """The most completion tokens a request lets its engine make; None when it
    sets no limit. llama.cpp reads ``n_predict`` (-1: none), then
    ``max_completion_tokens``, then ``max_tokens``, and a provider either of
    the last two, so the largest one given counts."""
    if request.get("n_predict") == -1:
        return None
    given = [
        v
        for v in (
            request.get("max_tokens"),
            request.get("max_completion_tokens"),
            request.get("n_predict"),
        )
        if v is not None
    ]
    return max(given) if given else None


def _one_prompt(request: Body) -> None:
    """A completion request's prompt is one prompt: a list of them gets as
    many answers under one usage, which would count as one."""
    prompt = request["prompt"]
    if isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str | list):
        raise GatewayError(
            400,
            f"Invalid value for 'prompt': it holds {len(prompt)} prompts; letsinfer answers "
            "one prompt per request, so send each as a request of its own.",
            param="prompt",
            code="invalid_value",
        )


def encode(data: dict[str, Any]) -> bytes:
    """A request changed by the gateway, as bytes again: compact UTF-8 JSON, or
    escaped where it holds a lone surrogate (which :func:`parse` accepts, as
    JSON does, and UTF-8 cannot hold)."""
    try:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


def parse(body: bytes, route: Route) -> Body:
    if jsondepth.too_deep(body):  # before the parser recurses into it
        raise GatewayError(400, jsondepth.too_deep_message(), code="json_too_deep")
    request = _validate(body, route.schema)
    if route.kind == "completion":
        _one_prompt(request)
    return request


def _validate(body: bytes, schema: TypeAdapter[Any]) -> Body:
    try:  # pydantic's own JSON parser: half the cost of json.loads, then validate
        return schema.validate_json(body)  # type: ignore[no-any-return]
    except ValidationError:
        pass  # refused, or stricter than json (a lone surrogate): the path below decides
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GatewayError(400, f"The request body is not valid JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise GatewayError(400, "The request body must be a JSON object.")
    try:
        return schema.validate_python(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "missing":
            message = f"Missing required parameter: '{param}'."
        else:
            message = f"Invalid value for '{param}': {first['msg']}."
        raise GatewayError(400, message, param=param, code="invalid_value") from exc
