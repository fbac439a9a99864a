"""Portal passwords: argon2id (argon2-cffi's defaults, RFC 9106's second
choice), their length the only rule.

A sign-in for an account that does not exist verifies a dummy hash all the
same, so the time an answer takes says nothing about which names exist.
"""

from __future__ import annotations

import functools

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

MIN_LENGTH = 12
MAX_LENGTH = 1024  # hashing a megabyte per try would be a way to tire the main out

_hasher = PasswordHasher()


class PasswordRefused(ValueError):
    pass


def check_length(password: str) -> None:
    if len(password) < MIN_LENGTH:
        raise PasswordRefused(f"a password must be at least {MIN_LENGTH} characters long")
    if len(password) > MAX_LENGTH:
        raise PasswordRefused(f"a password must be at most {MAX_LENGTH} characters long")


def hash_password(password: str) -> str:
    check_length(password)
    return _hasher.hash(password)


@functools.cache
def _dummy() -> str:
    return _hasher.hash("not any account's password: verified for names that do not exist")


def verify(stored: str | None, password: str) -> bool:
    """Whether ``password`` matches ``stored``; None (no such account) still
    costs one verification."""
    too_long = len(password) > MAX_LENGTH  # never anyone's: the same work, then no
    if too_long:
        stored, password = None, password[:MAX_LENGTH]
    try:
        return _hasher.verify(stored or _dummy(), password) and stored is not None
    except (VerificationError, InvalidHashError):
        return False
