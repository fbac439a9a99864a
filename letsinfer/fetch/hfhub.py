"""huggingface_hub's own HTTP calls to the hub (model info, file metadata),
through the same guard as every other fetch.

huggingface_hub makes its calls with its own copy of httpx (httpx2), whose
default client follows redirects to any host; the client this sets instead
checks each connection's address and follows redirects only as the policy
allows (``letsinfer.fetch.clients``, built for httpx2 and httpcore2).
"""

from __future__ import annotations

from typing import Any

from letsinfer.fetch.clients import GuardedKit, guarded_kit
from letsinfer.fetch.policy import FetchPolicy

_kit: GuardedKit | None = None


def use_guarded_session(policy: FetchPolicy) -> None:
    """Make every later huggingface_hub call in this process go through a
    client guarded by ``policy`` (the settings huggingface_hub's default has)."""
    global _kit
    import httpcore2
    import httpx2
    from huggingface_hub.utils import _http, set_client_factory

    if _kit is None:
        _kit = guarded_kit(httpx2, httpcore2)
    kit = _kit

    def factory() -> Any:
        return kit.make_client(
            policy,
            event_hooks={"request": [_http.hf_request_event_hook]},
            follow_redirects=True,
            timeout=None,
        )

    set_client_factory(factory)
