"""Portal sessions: a random id in an HttpOnly, SameSite=Strict cookie
(Secure over TLS), kept server-side in the authority as its SHA-256 (a copy
of the database signs no one in), with the session's CSRF token.

Before sign-in a visitor holds only a random "pre" cookie; the sign-in and
sign-up forms carry a token bound to it (an HMAC under this process's key),
so a form posted from another site, which cannot read the cookie, is
refused (login CSRF). Sign-in issues a new session id and drops the pre
cookie: an id planted before sign-in is never the one signed in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SESSION_COOKIE = "li_session"
PRE_COOKIE = "li_pre"


def new_id() -> str:
    return secrets.token_urlsafe(32)


def digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class PreTokens:
    """CSRF tokens for visitors not signed in, bound to their pre cookie."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)  # a restart asks for the form again

    def token(self, pre: str) -> str:
        return hmac.new(self._key, b"csrf:" + pre.encode(), hashlib.sha256).hexdigest()

    def valid(self, pre: str | None, given: str | None) -> bool:
        if not pre or not given:
            return False
        return hmac.compare_digest(self.token(pre), given)


def same(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())
