"""The one error type of mirror operations."""


class MirrorError(Exception):
    """A mirror operation was refused; the message says why. Nothing was changed."""
