"""How deep a JSON body nests, found without parsing it.

Python's ``json`` parser recurses once per level, so a body nested a few
thousand levels deep raises ``RecursionError`` (a 500 and a traceback per
request) instead of a clean refusal. Every JSON body a node parses is checked
here first, with C-speed byte operations only: the gateway's inference routes
call :func:`too_deep`; the FastAPI planes (control, agent, admin socket)
through letsinfer.bodylimits, in front of their routes.
"""

from __future__ import annotations

import operator
from itertools import accumulate, repeat

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
