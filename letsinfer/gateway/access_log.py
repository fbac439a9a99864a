"""The inference requests' access-log lines (logger ``letsinfer.access``).

One line per request, through the logger's level, filters and handlers as
``access_log.info`` would send it, at a fraction of its cost: no search of
the stack for the caller (no format here names it); with logging's own
record factory, each record copied from one made once per thread instead of
built field by field (what differs between two lines of one thread is their
time and their arguments; a factory set by someone else is used as is); and
the lines of requests that finish together written together
(:func:`write_many`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from urllib.parse import quote

logger = logging.getLogger("letsinfer.access")

_LINE = (
    "request_id=%s key=%s model=%s served=%s pg=%s status=%d queue_ms=%.2f "
    "ttft_ms=%s total_ms=%.2f prompt_tokens=%s completion_tokens=%s%s"
)

# A thread's own record template: kept with the thread (a thread's ident is
# reused once it ends, so a table by ident would give a new thread the old
# one's name).
_per_thread = threading.local()


def _record(args: tuple[object, ...]) -> logging.LogRecord:
    make = logging.getLogRecordFactory()
    if make is not logging.LogRecord:
        return make(logger.name, logging.INFO, __file__, 0, _LINE, args, None, "request")
    template = getattr(_per_thread, "template", None)
    if template is None:
        template = logging.LogRecord(
            logger.name, logging.INFO, __file__, 0, _LINE, (), None, "request"
        ).__dict__
        _per_thread.template = template
    record = logging.LogRecord.__new__(logging.LogRecord)
    fields = record.__dict__
    fields.update(template)
    now = time.time()
    fields["created"] = now
    fields["msecs"] = int((now - int(now)) * 1000) + 0.0
    fields["relativeCreated"] = (now - logging._startTime) * 1000  # type: ignore[attr-defined]
    fields["args"] = args
    return record


def write_many(lines: Iterable[tuple[object, ...]]) -> None:
    """Requests' lines, each from the ``args`` that fill :data:`_LINE`. When
    there are several and every handler they reach is a plain stream or file
    handler, each handler gets them in one write and one flush instead of one
    per line; otherwise they go one by one, as ``logger.handle`` sends them."""
    if not logger.isEnabledFor(logging.INFO) or logger.disabled:
        return
    records = []
    for args in lines:
        record = _record(args)
        kept = logger.filter(record)
        if kept:
            records.append(kept if isinstance(kept, logging.LogRecord) else record)
    handlers = _handlers()
    if len(records) > 1 and handlers and all(type(h) in _BATCHED for h in handlers):
        for handler in handlers:
            _emit_together(handler, records)
        return
    for record in records:
        logger.callHandlers(record)


# Handlers whose emit() is a format, a write to .stream and a flush.
_BATCHED = (logging.StreamHandler, logging.FileHandler)


def _handlers() -> list[logging.Handler]:
    """The handlers a record of the logger reaches, as Logger.callHandlers walks."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found.extend(current.handlers)
        if not current.propagate:
            break
        current = current.parent
    return found


def _emit_together(handler: logging.Handler, records: list[logging.LogRecord]) -> None:
    assert isinstance(handler, logging.StreamHandler)
    if handler.stream is None:  # a FileHandler that opens its file on first use
        for record in records:
            handler.handle(record)
        return
    handler.acquire()
    try:
        text = []
        for record in records:
            if record.levelno < handler.level:
                continue
            kept = handler.filter(record)
            if kept:
                text.append(
                    handler.format(kept if isinstance(kept, logging.LogRecord) else record)
                    + handler.terminator
                )
        if text:
            handler.stream.write("".join(text))
            handler.flush()
    except RecursionError:
        raise
    except Exception:
        handler.handleError(records[-1])
    finally:
        handler.release()


# Requests refused before their key is known answer anyone, as fast as they
# ask: their lines (any route) are held to a rate (the metrics and the audit's
# denial counts keep every one). Text a client chose (a path, a model name) is
# cut short and quoted, so it can neither fill the disk nor write fields into
# a line.
MAX_REFUSAL_LINES_PER_S = 20
MAX_LOGGED_TEXT = 200
_window = [0.0, 0, 0]  # second it counts, lines logged in it, lines left out since the last
_clock = time.monotonic


def loggable(text: str) -> str:
    """A client's text as one field of a line: as it is when it is short,
    printable and without spaces (a usual model name or path), else cut to
    MAX_LOGGED_TEXT characters and percent-quoted."""
    if len(text) <= MAX_LOGGED_TEXT and " " not in text and text.isprintable():
        return text
    quoted = quote(text[:MAX_LOGGED_TEXT], safe="/:@!$&'()*+,;=-._~")
    return quoted + ("..." if len(text) > MAX_LOGGED_TEXT else "")


def refusal_line_allowed() -> int | None:
    """Whether a refusal's line may be written now: None when this second's
    lines are spent (it is counted), else how many were left out before it.
    For the lines of requests refused before their key was known, on any route."""
    now = int(_clock())
    if now != _window[0]:
        _window[0], _window[1] = now, 0
    if _window[1] >= MAX_REFUSAL_LINES_PER_S:
        _window[2] += 1
        return None
    _window[1] += 1
    left_out, _window[2] = _window[2], 0
    return left_out


def refusal(request_id: str, status: int, path: str) -> None:
    """The line of a request refused on another route (``GET /v1/models``, ``/health``)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    left_out = refusal_line_allowed()
    if left_out is None:
        return
    logger.info(
        "request_id=%s key=- model=- served=- pg=- status=%d queue_ms=0.00 ttft_ms=- "
        "total_ms=0.00 prompt_tokens=- completion_tokens=- path=%s%s",
        request_id,
        status,
        loggable(path),
        f" refusals_not_logged={left_out}" if left_out else "",
    )
