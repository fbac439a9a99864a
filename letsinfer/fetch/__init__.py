"""Fetching URLs an operator gave (mirrors, hubs, providers, webhooks) safely:
http(s) only, redirects only within the same host, and no non-global address
(loopback, private, link-local, metadata, ...) unless ``[fetch] allow_networks``
lists its network. See docs/safe-fetching.md."""

from letsinfer.fetch.clients import guarded_async_client, guarded_client
from letsinfer.fetch.destinations import check_url
from letsinfer.fetch.policy import FetchPolicy, FetchRefused

__all__ = [
    "FetchPolicy",
    "FetchRefused",
    "check_url",
    "guarded_async_client",
    "guarded_client",
]
