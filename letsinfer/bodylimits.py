"""What the FastAPI planes (control, agent, admin socket) read of a request
body before any route sees it.

Some of their routes answer anyone: enrollment, pairing, a candidate's
requests. So the body is read here first, and refused when it is larger than
``max_bytes`` (413; a node's own messages are far smaller), when it is not
whole within ``timeout_s`` of the request's headers (408; a client trickling
a body would otherwise hold its connection for good, as the header deadline
in letsinfer.connections stops it doing with headers), or when its JSON nests
deeper than the parser can take (400, letsinfer.jsondepth). Either refusal
closes the connection, so an unread rest is never parsed as a next request.
A refusal says why in the planes' error shape; the body is never echoed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from letsinfer.jsondepth import MAX_DEPTH, too_deep, too_deep_message

# Far above any request a node, a controller or the CLI sends (facts take
# their own route, capped at 600,000 bytes), far below what hurts a node.
MAX_BODY_BYTES = 1 << 20
BODY_TIMEOUT_S = 10.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _json_body(scope: Scope) -> bool:
    """Whether FastAPI would parse this request's body as JSON: a JSON content
    type, or none (FastAPI then tries JSON too)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json" or kind.endswith(b"+json")
    return True


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses it before it gets here
    return None


class BodyLimits:
    """ASGI middleware in front of a plane's routes (see the module's doc)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = MAX_BODY_BYTES,
        timeout_s: float = BODY_TIMEOUT_S,
        depth: int = MAX_DEPTH,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.depth = depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _refuse(send, 413, self._too_large())
            return
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                message = await receive()
                while message["type"] == "http.request":
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_bytes:
                        await _refuse(send, 413, self._too_large())
                        return
                    parts.append(chunk)
                    if not message.get("more_body"):
                        break
                    message = await receive()
        except TimeoutError:
            await _refuse(
                send, 408, f"The request body did not arrive whole within {self.timeout_s:g}s."
            )
            return
        if message["type"] != "http.request":  # the client left: let the app see it
            first: Message = message
        else:
            body = b"".join(parts)
            if _json_body(scope) and too_deep(body, self.depth):
                await _refuse(send, 400, too_deep_message(self.depth))
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

    def _too_large(self) -> str:
        return f"The request body is larger than {self.max_bytes} bytes."


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "code": status}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status != 400:  # the body was not read (whole): nothing after it can be trusted
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
