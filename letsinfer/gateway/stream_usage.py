"""Token counts of streamed answers, for the records and the access log.

A streamed chat answer carries its token counts only when the client asked
for them (``stream_options.include_usage``): then the engine sends one more
event, with empty ``choices`` and a ``usage`` object, before ``[DONE]``.
When the client did not ask, the gateway asks on its behalf
(:func:`ask_for_usage`) and :class:`UsageFilter` takes that event out of the
stream again, so the client gets exactly what it asked for.

The filter passes whole events only: a chunk that ends inside an event keeps
its tail until the rest arrives (a client cannot use half an event anyway),
so an event is never cut when one is removed. The usage event is parsed; no
other event is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from letsinfer.gateway import protocol

_FIELD = b'"stream_options":{"include_usage":true},'
_USAGE = b'"usage"'
_EVENTS = re.compile(rb"(\r?\n\r?\n)")
MAX_PENDING = 64 * 1024  # the most of an unfinished event kept back


def ask_for_usage(body: bytes, stream_options: dict[str, Any] | None) -> bytes:
    """The client's request with ``include_usage`` set. Its own bytes with one
    field added in front when it sent no stream_options, else re-encoded."""
    if stream_options is None:
        start = body.find(b"{")  # the body is a JSON object (checked already)
        return body[: start + 1] + _FIELD + body[start + 1 :]
    data = json.loads(body)
    data["stream_options"] = {**stream_options, "include_usage": True}
    return protocol.encode(data)


def wants_usage(stream_options: dict[str, Any] | None) -> bool:
    return bool(stream_options and stream_options.get("include_usage") is True)


def counted(body: bytes, parsed: Mapping[str, Any]) -> tuple[UsageFilter, bytes]:
    """A streamed request's filter, and its body as sent to the engine (usage
    asked for on the client's behalf when it did not ask). Counted from the
    usage event itself: never a guess from the stream's last bytes, which a
    slow network splits anywhere."""
    stream_options = parsed.get("stream_options")
    usage_asked = wants_usage(stream_options)
    if not usage_asked:
        if stream_options is None and "stream_options" in parsed:
            # "stream_options": null: re-encoded, since a field added in front
            # would come before the client's, and engines read the last one.
            stream_options = {}
        body = ask_for_usage(body, stream_options)
    return UsageFilter(strip=not usage_asked), body


def _event_end(data: bytes) -> int:
    """Where the last complete event in ``data`` ends (0: none does)."""
    if data.endswith(b"\n\n"):  # the usual read: whole events (no search back through it)
        return len(data)
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


class UsageFilter:
    """Notes a stream's usage event; with ``strip`` (the gateway asked for it,
    not the client) also takes it out of the stream."""

    __slots__ = ("completion_tokens", "pending", "prompt_tokens", "strip")

    def __init__(self, strip: bool = True) -> None:
        self.strip = strip
        self.pending = b""
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

    def feed(self, chunk: bytes) -> bytes:
        """The complete events received so far, less the usage event."""
        data = self.pending + chunk if self.pending else chunk
        end = _event_end(data)
        if end == len(data):
            self.pending = b""
        else:
            data, self.pending = data[:end], data[end:]
            if len(self.pending) > MAX_PENDING:
                # An event that does not end (no usage event is this long): passed
                # on as it arrives, not kept and searched again at every read.
                data, self.pending = data + self.pending, b""
        at = data.find(_USAGE)
        return data if at < 0 else self._take_usage(data, at)

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated event)."""
        rest, self.pending = self.pending, b""
        at = rest.find(_USAGE)
        return rest if at < 0 else self._take_usage(rest, at)

    def _take_usage(self, data: bytes, at: int) -> bytes:
        """``data`` less the usage event, its first ``"usage"`` being at ``at``."""
        if b"\r" not in data:  # engines end lines with \n: a plain split, ten times faster
            return self._take_usage_lf(data, at)
        parts = _EVENTS.split(data)  # event, separator, event, separator, ..., rest
        kept = []
        for i in range(0, len(parts), 2):
            event, sep = parts[i], parts[i + 1] if i + 1 < len(parts) else b""
            if _USAGE in event and self._usage_only(event) and self.strip:
                continue  # the event the gateway asked for: not the client's
            kept.append(event + sep)
        return b"".join(kept)

    def _take_usage_lf(self, data: bytes, at: int) -> bytes:
        """:meth:`_take_usage` of data without carriage returns: the events
        around each ``"usage"`` found by byte search, not by splitting the
        whole stream; only those whose usage is an object are parsed (an
        engine may send ``"usage":null`` in every event)."""
        kept: list[bytes] = []
        start = 0  # what is kept runs from here to the next dropped event
        while at >= 0:
            begins = data.rfind(b"\n\n", 0, at)
            begins = 0 if begins < 0 else begins + 2
            ends = data.find(b"\n\n", at)
            ends = len(data) if ends < 0 else ends + 2  # the rest: no separator after it
            value = data[at + len(_USAGE) : at + len(_USAGE) + 8].lstrip(b" :")
            if value.startswith(b"{") and self._usage_only(data[begins:ends]) and self.strip:
                kept.append(data[start:begins])
                start = ends
            at = data.find(_USAGE, ends)
        if not start:
            return data
        kept.append(data[start:])
        return b"".join(kept)

    def _usage_only(self, event: bytes) -> bool:
        """Note the event's usage; true when it carries nothing else."""
        if event.startswith(b"data:") and _one_line(event):
            data = event[5:]  # (the usual event: its one line is its data)
        else:
            data = b"\n".join(
                ln[5:].lstrip() for ln in event.splitlines() if ln.startswith(b"data:")
            )
        try:
            obj = json.loads(data.decode())  # (decoded here: json.loads would guess the encoding)
        except ValueError:  # (a UnicodeDecodeError too)
            return False
        if not isinstance(obj, dict) or not isinstance(obj.get("usage"), dict):
            return False
        usage = obj["usage"]
        self.prompt_tokens = _int(usage.get("prompt_tokens"))
        self.completion_tokens = _int(usage.get("completion_tokens"))
        return obj.get("choices") == []


def _one_line(event: bytes) -> bool:
    body = event.rstrip(b"\r\n")
    return b"\n" not in body and b"\r" not in body


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
