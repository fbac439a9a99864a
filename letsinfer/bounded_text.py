"""Text a peer or a client chose, as an answer, a log line or an audit record
may show it: cut to a bound and with what is not printable escaped, so that
no sender can make any of those large, or forge a line of a log."""

from __future__ import annotations

MAX_SHOWN = 64  # characters of a name a sender chose: enough to recognise it


def bounded(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` as it is when short and printable, else its first ``limit``
    characters (non-printable ones escaped) and "..." when it was longer."""
    if len(text) <= limit and text.isprintable():
        return text
    cut = text[:limit]
    if not cut.isprintable():
        cut = repr(cut)[1:-1]
    return cut + "..." if len(text) > limit else cut
