"""Request tags: ``X-Letsinfer-Tags: a,b`` names what a request was for (a
team, a feature, an experiment), kept in its request record and summed by
``letsinfer usage --by tag``.

Tags are bounded and refused whole when they are not: a request with too many
tags, a tag too long or with other characters than letters, digits and
``._:-`` is answered 400 (OpenAI's error shape, ``param`` naming the header).
Refused, not truncated: a tag cut short or dropped would count the request
under another name in every later sum, silently; a client that sends one gets
told at once, before it spent any tokens.

Read with the other headers in the loop both request paths already run, and
parsed only when present: a request without tags pays one comparison more.
"""

from __future__ import annotations

import json
import re

from letsinfer.gateway.errors import GatewayError

MAX_TAGS = 8
MAX_TAG_CHARS = 64
_TAG = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_TAG_CHARS}}}")


def bad_tags(message: str) -> GatewayError:
    return GatewayError(400, message, code="invalid_tags", param="X-Letsinfer-Tags")


def parse(value: bytes) -> str | None:
    """The header's tags as the records keep them (a JSON array of distinct
    tags, in the order sent), None when it names none; GatewayError (400)
    when it is out of bounds."""
    text = value.decode("latin-1")
    tags: list[str] = []
    for part in text.split(","):
        tag = part.strip()
        if not tag:
            continue
        if not _TAG.fullmatch(tag):
            shown = tag[:MAX_TAG_CHARS] + ("..." if len(tag) > MAX_TAG_CHARS else "")
            raise bad_tags(
                f"Tag {json.dumps(shown)} in X-Letsinfer-Tags is not allowed: a tag is 1 to "
                f"{MAX_TAG_CHARS} letters, digits or . _ : - (tags are separated by commas)."
            )
        if tag not in tags:
            tags.append(tag)
            if len(tags) > MAX_TAGS:
                raise bad_tags(f"X-Letsinfer-Tags names more than {MAX_TAGS} tags.")
    return json.dumps(tags, separators=(",", ":")) if tags else None
