"""``POST /v1/agent/facts``: every node posts here every heartbeat, so this one
route skips FastAPI's routing, dependencies and middleware (as the gateway's
inference routes do) and is plain ASGI behind the plane's ``PeerGate``, which
has verified the peer already. Bodies are bounded and their JSON depth checked
before anything parses them, as on every plane.

A report is shed with 503 and ``Retry-After`` when the main is behind
(letsinfer/authority/overload.py), refused with 422 (and counted as a denial)
when its facts do not verify, and answered with the node's desired state
once its facts are on disk.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from letsinfer.authority.factwriter import NotRecorded
from letsinfer.bounded_text import bounded
from letsinfer.contracts.facts import FactError
from letsinfer.jsondepth import too_deep, too_deep_message
from letsinfer.trust.peer import Peer

PATH = "/v1/agent/facts"
MAX_BODY = 600_000  # the envelope's facts (256,000 characters) escaped inside JSON

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class FactEnvelope(BaseModel):
    model_config = ConfigDict(extra="forbid")
    facts: str = Field(max_length=256_000)
    signature: str = Field(max_length=512)


class FactsRoute:
    """ASGI: this route itself, everything else to ``app`` (the plane's FastAPI)."""

    def __init__(
        self,
        app: ASGIApp,
        reports: Any,  # letsinfer.control.app.ReportIntake
        refused: Callable[[Peer, str], None],  # a denial, counted
        heartbeat_interval_s: float,
    ) -> None:
        self.app = app
        self.reports = reports
        self.refused = refused
        self.heartbeat_interval_s = heartbeat_interval_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _answer(send, 405, {"error": {"message": "Method Not Allowed", "code": 405}})
            return
        peer: Peer = scope["state"]["peer"]  # the gate let only a verified node through
        retry = self.reports.admit()
        if retry is not None:  # behind: a short answer now beats a timeout later
            self.reports.heard(peer.identity.id)
            await _busy(send, retry, "the main is busy; report again after Retry-After")
            return
        body = await _body(receive)
        if body is None:
            await _answer(send, 413, _error("the facts envelope is too large", 413))
            return
        if too_deep(body):
            await _answer(send, 400, _error(too_deep_message(), 400))
            return
        try:
            envelope = FactEnvelope.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            # (An unknown field's name is the peer's text: shown bounded.)
            where = ".".join(bounded(str(p)) for p in first["loc"]) or "body"
            why = f"malformed fact envelope ({where}: {first['msg']})"
            await _answer(send, 422, _error(why, 422))
            return
        der = scope["extensions"]["tls"]["client_cert_der"]
        try:
            answer = await self.reports.report(peer, der, envelope.model_dump())
        except FactError as exc:
            self.refused(peer, exc.reason)
            await _answer(send, 422, _error(f"facts refused: {exc}", 422))
            return
        except NotRecorded:
            wait = max(1, round(self.heartbeat_interval_s))
            await _busy(send, wait, "the main could not record the facts; report again")
            return
        await _answer(send, 200, answer)


def _error(message: str, code: int | str) -> dict[str, Any]:
    return {"error": {"message": message, "code": code}}


async def _body(receive: Receive) -> bytes | None:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def _busy(send: Send, retry_after: int, why: str) -> None:
    await _answer(
        send, 503, _error(why, "main_busy"), [(b"retry-after", str(retry_after).encode())]
    )


async def _answer(
    send: Send,
    status: int,
    payload: dict[str, Any],
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
