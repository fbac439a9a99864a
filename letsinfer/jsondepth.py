"""How deep a JSON body nests, found without parsing it.

Python's ``json`` parser recurses once per level, so a body nested a few
thousand levels deep raises ``RecursionError`` (a 500 and a traceback per
request) instead of a clean refusal. Every JSON body a node parses is checked
here first, with C-speed byte operations only: the gateway's inference routes
call :func:`too_deep`; the FastAPI planes (control, agent, admin socket) put
:class:`JsonDepthLimit` in front of their routes.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Awaitable, Callable, MutableMapping
from itertools import accumulate, repeat
from typing import Any

# Deeper than any request letsinfer or an OpenAI client sends (a tool's JSON
# schema included), far below what the parser's recursion can take.
MAX_DEPTH = 64

_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")  # nesting is all that counts
_STEP = bytes.maketrans(b"[]", b"\x02\x00")  # minus one below: +1 / -1


def too_deep(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether ``body`` opens more than ``limit`` arrays or objects inside
    each other. Invalid JSON may count as deep (it is refused either way); a
    body the parser would take deeper than ``limit`` never passes."""
    if body.count(b"[") + body.count(b"{") <= limit:  # the usual case: no scan
        return False
    # Brackets inside strings are text: drop escape pairs (backslash, quote),
    # then every other piece between quotes is outside the strings.
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(body.split(b'"')[::2])
    structure = outside.translate(_ONE_KIND, _NOT_BRACKET)
    # Each pass removes the innermost level; a few passes empty a usual body.
    rest = structure
    for _ in range(limit):
        if not rest:
            return False
        shorter = rest.replace(b"[]", b"")
        if len(shorter) == len(rest):  # unbalanced (invalid JSON): count exactly
            steps = structure.translate(_STEP)
            return max(accumulate(map(operator.sub, steps, repeat(1)))) > limit
        rest = shorter
    return bool(rest)


def too_deep_message(limit: int = MAX_DEPTH) -> str:
    return f"The request body nests JSON deeper than {limit} levels."


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _json_body(scope: Scope) -> bool:
    """Whether FastAPI would parse this request's body as JSON: a method with a
    body and a JSON content type, or none (FastAPI then tries JSON too)."""
    if scope["method"] in ("GET", "HEAD", "OPTIONS"):
        return False
    for name, value in scope["headers"]:
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json" or kind.endswith(b"+json")
    return True


class JsonDepthLimit:
    """ASGI middleware: a JSON request body nested deeper than ``limit`` is
    answered 400 (the planes' error shape) before any route parses it; any
    other body is handed on unchanged."""

    def __init__(self, app: ASGIApp, limit: int = MAX_DEPTH) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _json_body(scope):
            await self.app(scope, receive, send)
            return
        parts: list[bytes] = []
        message = await receive()
        while message["type"] == "http.request":
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
            message = await receive()
        if message["type"] != "http.request":  # the client left: let the app see it
            first: Message = message
        else:
            body = b"".join(parts)
            if too_deep(body, self.limit):
                await _refuse(send, too_deep_message(self.limit))
                return
            first = {"type": "http.request", "body": body, "more_body": False}
        given = False

        async def replay() -> Message:
            nonlocal given
            if not given:
                given = True
                return first
            return await receive()

        await self.app(scope, replay, send)


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"error": {"message": message, "code": 400}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
