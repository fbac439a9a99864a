"""Fetching URLs an operator gave (mirrors, hubs, providers, webhooks) safely:
http(s) only, redirects only within the same host, and no non-global address
(loopback, private, link-local, metadata, ...) unless ``[fetch] allow_networks``
lists its network. See docs/safe-fetching.md."""

from typing import TYPE_CHECKING, Any

from letsinfer.fetch.destinations import check_url
from letsinfer.fetch.policy import FetchPolicy, FetchRefused

if TYPE_CHECKING:
    from letsinfer.fetch.clients import guarded_async_client, guarded_client


def __getattr__(name: str) -> Any:
    # The clients import httpx and httpcore; a command that only reads a
    # policy (webhook list, mirror list) does not pay for them.
    if name in ("guarded_async_client", "guarded_client"):
        from letsinfer.fetch import clients

        return getattr(clients, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FetchPolicy",
    "FetchRefused",
    "check_url",
    "guarded_async_client",
    "guarded_client",
]
