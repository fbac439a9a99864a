"""A long operation's answer as it happens (`model pull`, `model add`,
`model update` from a controller), for a client that asks for it with
``Accept: application/x-ndjson``: one JSON event a line, in order,

- ``{"event": "said", "line": {...}}``: a line of what the operation says;
- ``{"event": "start", "description": ..., "total": ...}``, ``{"event":
  "advance", "amount": ...}``, ``{"event": "finish"}``: a step's progress
  (a start stands for the line the plain answer's ``said`` has for it);
- ``{"event": "answer", "status": ..., "body": ...}``: last, exactly the
  status and body the route answers without the stream.

Without that header the route answers once, as it always has.

The operation runs in a task of its own, not the response's: a controller
that hangs up stops the events, never the work. Memory stays bounded by the
answer's own transcript: said lines and step starts are all kept (the
answer carries them anyway), and while the reader is behind, the bytes
advanced since it last read wait as one event."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi import HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, StreamingResponse

from letsinfer.admission.said import Line, SaidProgress, Transcript

STREAM = "application/x-ndjson"
log = logging.getLogger(__name__)

# Running operations, kept until done: the loop holds its tasks only weakly.
running: set[asyncio.Task[None]] = set()


def wants_stream(request: Request) -> bool:
    return STREAM in request.headers.get("accept", "")


class Events:
    """Events from the operation (its worker thread or the loop) to the one
    reader of the response, woken on the loop."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._queued: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()

    def put(self, event: dict[str, Any]) -> None:
        with self._lock:
            last = self._queued[-1] if self._queued else None
            if event["event"] == "advance" and last is not None and last["event"] == "advance":
                last["amount"] += event["amount"]  # the reader is behind: one event for both
                return
            self._queued.append(event)
        if last is None:  # else the reader was woken for the first and takes all
            self._loop.call_soon_threadsafe(self._ready.set)

    def heard(self, line: Line) -> None:
        self.put({"event": "said", "line": asdict(line)})

    async def drained(self) -> AsyncIterator[dict[str, Any]]:
        """Every event, in order, up to the answer."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            with self._lock:
                taken = list(self._queued)
                self._queued.clear()
            for event in taken:
                yield event
                if event["event"] == "answer":
                    return


class ShownProgress:
    """A step's progress as events, kept in the transcript as SaidProgress
    keeps it (the answer is the plain one)."""

    def __init__(self, said: Transcript, events: Events) -> None:
        self._kept = SaidProgress(said.unheard())
        self._events = events

    def start(self, description: str, total: int | None) -> None:
        self._kept.start(description, total)
        self._events.put({"event": "start", "description": description, "total": total})

    def advance(self, amount: int) -> None:
        self._events.put({"event": "advance", "amount": amount})

    def finish(self) -> None:
        self._events.put({"event": "finish"})


Work = Callable[[Transcript, Callable[[], Any]], Awaitable[Any]]


async def answered(request: Request, work: Work) -> Any:
    """What ``work`` answers, given a transcript and a maker of its progress:
    once (the plain answer), or streamed as it happens when asked for."""
    if not wants_stream(request):
        said = Transcript()
        return await work(said, lambda: SaidProgress(said))
    events = Events()
    said = Transcript(heard=events.heard)

    async def run() -> None:
        try:
            done = await work(said, lambda: ShownProgress(said, events))
            if isinstance(done, JSONResponse):
                status, body = done.status_code, json.loads(bytes(done.body))
            else:
                status, body = 200, jsonable_encoder(done)
        except asyncio.CancelledError:  # the main is stopping: the reader is told so
            message = "the main stopped before the operation ended"
            events.put(
                {
                    "event": "answer",
                    "status": 503,
                    "body": {"error": {"message": message, "code": 503}},
                }
            )
            raise
        except HTTPException as exc:
            status = exc.status_code
            body = {"error": {"message": exc.detail, "code": exc.status_code}}
        except Exception:  # as the plain answer's 500; the log says why
            log.exception("%s %s failed", request.method, request.url.path)
            status, body = 500, {"error": {"message": "Internal Server Error", "code": 500}}
        events.put({"event": "answer", "status": status, "body": body})

    task = asyncio.create_task(run())
    running.add(task)
    task.add_done_callback(running.discard)

    async def lines() -> AsyncIterator[str]:
        async for event in events.drained():
            yield json.dumps(event) + "\n"

    return StreamingResponse(lines(), media_type=STREAM)
