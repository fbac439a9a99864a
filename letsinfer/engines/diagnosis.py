"""The engine's own words about why it failed: error lines from its output.

llama.cpp logs a line per step with a level letter (``... E llama_model_load:
error loading model: unknown model architecture: 'x'``); an operator needs
those lines, not "exited with code 1". Bounded, so it fits a signed fact.
"""

from __future__ import annotations

import re
from pathlib import Path

_LEVELLED = re.compile(r"^\d+(?:\.\d+){3} ([A-Z]) +")  # llama.cpp's "0.00.003.749 E "
_ERROR = re.compile(r"error|fail|exception|traceback|refus", re.IGNORECASE)
_TAIL_BYTES = 64 * 1024


def error_lines(output: str, limit: int = 480) -> str:
    """The distinct error lines of ``output`` (its last lines when none look
    like errors), joined with " | " and cut to ``limit`` characters."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    picked = [line for line in lines if _is_error(line)] or lines[-3:]
    seen: list[str] = []
    for line in picked:
        text = _LEVELLED.sub("", line)
        if text not in seen:
            seen.append(text)
    if len(seen) > 4:
        seen = [*seen[:3], seen[-1]]
    joined = " | ".join(seen)
    return joined if len(joined) <= limit else joined[: limit - 1] + "…"


def _is_error(line: str) -> bool:
    levelled = _LEVELLED.match(line)
    if levelled:  # llama.cpp said how bad it is
        return levelled.group(1) == "E"
    return bool(_ERROR.search(line))


def log_since(path: Path, offset: int) -> str:
    """What an engine wrote to its log from ``offset`` on (at most the last 64 KiB)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            end = fh.tell()
            fh.seek(max(offset, end - _TAIL_BYTES))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
