"""The inference requests' access-log lines (logger ``letsinfer.access``).

One line per request, through the logger's level, filters and handlers as
``access_log.info`` would send it, at a fraction of its cost: no search of
the stack for the caller (no format here names it), and, with logging's own
record factory, each record copied from one made once per thread instead of
built field by field (what differs between two lines of one thread is their
time and their arguments). A factory set by someone else is used as is.
"""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("letsinfer.access")

_LINE = (
    "request_id=%s key=%s model=%s served=%s pg=%s status=%d queue_ms=%.2f "
    "ttft_ms=%s total_ms=%.2f prompt_tokens=%s completion_tokens=%s%s"
)

_templates: dict[int, dict[str, object]] = {}  # by thread


def _record(args: tuple[object, ...]) -> logging.LogRecord:
    make = logging.getLogRecordFactory()
    if make is not logging.LogRecord:
        return make(logger.name, logging.INFO, __file__, 0, _LINE, args, None, "request")
    thread = threading.get_ident()
    template = _templates.get(thread)
    if template is None:
        template = logging.LogRecord(
            logger.name, logging.INFO, __file__, 0, _LINE, (), None, "request"
        ).__dict__
        _templates[thread] = template
    record = logging.LogRecord.__new__(logging.LogRecord)
    fields = record.__dict__
    fields.update(template)
    now = time.time()
    fields["created"] = now
    fields["msecs"] = int((now - int(now)) * 1000) + 0.0
    fields["relativeCreated"] = (now - logging._startTime) * 1000  # type: ignore[attr-defined]
    fields["args"] = args
    return record


def write(args: tuple[object, ...]) -> None:
    """One request's line; ``args`` fill :data:`_LINE`."""
    if logger.isEnabledFor(logging.INFO):
        logger.handle(_record(args))


def refusal(request_id: str, status: int, path: str) -> None:
    """The line of a request refused on another route (``GET /v1/models``, ``/health``)."""
    logger.info(
        "request_id=%s key=- model=- served=- pg=- status=%d queue_ms=0.00 ttft_ms=- "
        "total_ms=0.00 prompt_tokens=- completion_tokens=- path=%s",
        request_id,
        status,
        path if path.isprintable() else repr(path),
    )
