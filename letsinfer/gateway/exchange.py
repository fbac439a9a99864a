"""What one request did (its :class:`Exchange`: id, model, group, status,
tokens, timings), how it is named and its access lines are written, and the
small rewrites of its answer (the model name it answers as, its usage): kept
apart from the handler (letsinfer.gateway.serving) so that what records a
request is lower than what serves it (tracing reads it too)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
from collections.abc import Iterator
from typing import Any

from letsinfer.gateway import access_log
from letsinfer.gateway.directory import ServiceEntry
from letsinfer.gateway.limits import Admitted
from letsinfer.gateway.routing import Replica
from letsinfer.gateway.stream_usage import UsageFilter

CLIENT_GONE = 499  # nginx's status for "the client closed the connection"

_SANE_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
# Generated ids: a random per-process prefix and a counter (unique, and
# cheaper than a UUID per request).
_ID_PREFIX = os.urandom(8).hex()
_ids = itertools.count(1)


def request_id_from(given: bytes | None) -> str:
    if given and _SANE_REQUEST_ID.fullmatch(given):
        return given.decode()
    return f"{_ID_PREFIX}{next(_ids):016x}"  # 32 hex digits, like a UUID


def answers_as(entry: ServiceEntry) -> bytes | None:
    """The model name its answers carry, when the engine's would be another:
    an adapter's (the engine names its base, which a key allowed only the
    adapter is never told), an external model's (the provider names its own
    model). None: the engine's name is the model's."""
    if entry.base is None and entry.external is None:
        return None
    return json.dumps(entry.name).encode()


# The answer's (or a stream event's) "model" field, outside any string.
_MODEL_FIELD = re.compile(rb'(?<!\\)"model"(\s*:\s*)"(?:[^"\\]|\\.)*"')


def renamed(answer: bytes, name: bytes) -> bytes:
    """``answer`` (whole, or whole stream events) with its model named ``name``
    (a JSON string)."""
    return _MODEL_FIELD.sub(lambda m: b'"model"' + m[1] + name, answer)


_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


def usage_tokens(tail: bytes) -> tuple[int | None, int | None]:
    """Prompt and completion tokens from the last ``usage`` object in ``tail``,
    found by a byte search: cheap, and no JSON parse of the answer."""
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None, None
    prompt = _PROMPT_TOKENS.search(tail, at)
    completion = _COMPLETION_TOKENS.search(tail, at)
    return (
        int(prompt[1]) if prompt else None,
        int(completion[1]) if completion else None,
    )


class Exchange:
    """What one request did, for its access-log line and metrics."""

    __slots__ = (
        "admitted",
        "arrived",
        "asked",
        "cache",
        "cache_key",
        "cut_off",
        "done",
        "endpoint",
        "fallback",
        "gone",
        "head_sent",
        "key",
        "load_wait",
        "node",
        "pg",
        "project_admitted",
        "queue_s",
        "renamed",
        "request_id",
        "responded",
        "served",
        "started",
        "status",
        "stream",
        "tags",
        "tail",
        "task",
        "tokens",
        "total",
        "ttft",
        "usage",
    )

    def __init__(self, request_id: str, task: asyncio.Task[Any] | None) -> None:
        self.request_id = request_id
        self.task = task
        self.started = time.perf_counter()
        self.arrived = time.time()
        self.asked = self.served = self.pg = self.key = "-"
        self.node: str | None = None
        self.endpoint = "-"
        self.stream = False
        self.usage: UsageFilter | None = None  # every streamed completion
        self.tokens: tuple[int | None, int | None] = (None, None)  # prompt, completion
        self.total = 0.0  # seconds from arrival to the end
        self.status = 0
        self.queue_s = 0.0
        self.load_wait: float | None = None  # seconds it waited for its model to load
        self.ttft: float | None = None
        self.tail = b""
        self.done = False
        self.gone = False
        self.responded = False  # the status line went out
        self.head_sent = False  # ... early: a stream that opened while its model loaded
        self.admitted: Admitted | None = None  # what its key's limits counted: charged at the end
        self.project_admitted: Admitted | None = None  # and its project's, the same way
        self.cache: bytes | None = None  # hit, miss or bypass, for a key with a cache
        self.cache_key: bytes | None = None  # where to keep the answer
        self.fallback: str | None = None  # the model that answered instead
        self.cut_off = False  # its answer ended early: a timeout, a broken stream, the client
        # The name its answer gives as its model, when not the engine's own
        # (an adapter's, or an external model's instead of the provider's).
        self.renamed: bytes | None = None
        self.tags: str | None = None  # its X-Letsinfer-Tags, as records keep them

    def at_engine(self, replica: Replica | None) -> None:
        """The replica working on the request now (None: none did any work)."""
        if replica is None:
            self.pg, self.node = "-", None
        else:
            self.pg, self.node = replica.pg_id, replica.node_id or None

    def client_gone(self) -> None:
        """The client left before its answer was complete: stop its request."""
        if not self.done and self.task is not None:
            self.gone = True
            self.task.cancel()


def access_lines(finished: list[Exchange]) -> Iterator[tuple[object, ...]]:
    for ex in finished:
        extra = _access_extra(ex)
        if ex.key == "-":  # refused before its key was known: anyone's, at any rate
            left_out = access_log.refusal_line_allowed()
            if left_out is None:
                continue
            if left_out:
                extra += f" refusals_not_logged={left_out}"
        yield (
            ex.request_id,
            ex.key,
            ex.asked,
            ex.served,
            ex.pg,
            ex.status,
            ex.queue_s * 1000,
            "-" if ex.ttft is None else f"{ex.ttft * 1000:.2f}",
            ex.total * 1000,
            "-" if ex.tokens[0] is None else ex.tokens[0],
            "-" if ex.tokens[1] is None else ex.tokens[1],
            extra,
        )


def _access_extra(ex: Exchange) -> str:
    extra = ""
    if ex.cache is not None:
        extra = f" cache={ex.cache.decode()}"
    if ex.fallback is not None:
        extra += f" fallback={ex.fallback}"
    return extra


def stream_error_event(message: str, code: str = "upstream_stream_error") -> bytes:
    error = {
        "message": message,
        "type": "server_error",
        "param": None,
        "code": code,
    }
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
