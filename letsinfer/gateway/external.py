"""External models: an OpenAI-compatible provider published under a model name.

Each external model is one replica in the routing table (group id
``external:NAME``) whose base URL is the provider's: admission, retries before
the first byte, streaming chunk by chunk and the request records work as for
an engine. What differs happens per request, just before it is sent
(:func:`prepare`): the body's ``model`` becomes the provider's model name, and
the provider's key, read from its file at that moment, goes in the
Authorization header. The key is never kept: not in the authority (only the
file's path is), not in a log line, not in the client's cached request heads;
changing the file changes the key from the next request on.

TLS to the provider is verified against the system's CAs, or against the
model's own CA file when it names one; there is no way to turn verification
off.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import ssl
import time
from pathlib import Path

from letsinfer.gateway import protocol
from letsinfer.gateway.errors import GatewayError
from letsinfer.gateway.providers import GROUP_PREFIX, ExternalModel
from letsinfer.gateway.routing import Replica, RoutingTable

log = logging.getLogger("letsinfer.gateway")


def key_unreadable(model: str) -> GatewayError:
    return GatewayError(
        502,
        f"Model '{model}' cannot be reached: the gateway cannot read its provider key "
        "(see the gateway's log).",
        type_="server_error",
        code="provider_key_unreadable",
    )


def refused_key(model: str, status: int) -> GatewayError:
    log.error("model %s: its provider refused the gateway's key (HTTP %d)", model, status)
    return GatewayError(
        502,
        f"Model '{model}' cannot be reached: its provider refused the key letsinfer "
        "holds for it (see the gateway's log).",
        type_="server_error",
        code="provider_refused_key",
    )


def unreachable(exc: BaseException) -> str:
    """A provider that could not be reached, as a client may read it: why, not
    where (the gateway's log has its address)."""
    if isinstance(exc.__cause__, ssl.SSLCertVerificationError):
        return "its provider's TLS certificate did not verify (see the gateway's log)"
    return "cannot reach its provider (see the gateway's log)"


def failed(status: int) -> bool:
    """A provider's answer that is a failure of its own, not of the request:
    rate limited, a server error (a 503 too: unlike an engine, a provider has
    no other replica to try, and its Retry-After says when), or one
    that says it is set up wrong (:func:`misconfigured`)."""
    return status == 429 or status >= 500 or misconfigured(status)


def misconfigured(status: int) -> bool:
    """An answer no client could use as ours, since it is about how the model
    is set up: a redirect (never followed: the key would go with it; the
    client gets no Location), or no such route or model at the provider (404,
    405, 410: a wrong URL or provider model, or one it retired), which told
    as it is would say that a model ``/v1/models`` lists does not exist."""
    return 300 <= status < 400 or status in (404, 405, 410)


def provider_failed(model: str, status: int) -> GatewayError:
    log.warning("model %s: its provider answered HTTP %d", model, status)
    return GatewayError(
        502,
        f"Model '{model}' cannot answer: its provider answered HTTP {status}.",
        type_="server_error",
        code="provider_failed",
    )


# A provider's Retry-After is relayed within these (seconds): never an
# invitation to retry at once, never a wait of more than a day; and a 429
# without one a client can use gets the default (every 429 says when).
RETRY_AFTER_RANGE = (1, 86_400)
RETRY_AFTER_DEFAULT = b"5"


def retry_after(status: int, value: bytes | None) -> bytes | None:
    """What a provider's relayed failure tells the client of when to retry:
    its Retry-After as whole seconds (from seconds or an HTTP date), else
    for a 429 the default."""
    seconds = _seconds(value)
    return seconds if seconds is not None or status != 429 else RETRY_AFTER_DEFAULT


def _seconds(value: bytes | None) -> bytes | None:
    if value is None or not 0 < len(value) <= 40 or not value.isascii():
        return None
    text = value.decode().strip()
    if text.isdigit():
        seconds = float(text)
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # (an HTTP date is GMT; a zone-less one is not one)
            return None
        seconds = when.timestamp() - time.time()
    low, high = RETRY_AFTER_RANGE
    return str(int(min(max(math.ceil(seconds), low), high))).encode()


def sendable(key: str) -> bool:
    """Whether a key can go in an Authorization header as it is: one word of
    visible ASCII (as API keys and RFC 6750's bearer tokens are)."""
    return bool(key) and key.isascii() and key.isprintable() and " " not in key


def read_key(model: str, path: str) -> str:
    """The provider's key, read now (the file's path may be logged, never its text)."""
    try:
        key = Path(path).read_text().strip()
    except (OSError, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        log.error("model %s: cannot read its provider key file %s: %s", model, path, why)
        raise key_unreadable(model) from exc
    if not sendable(key):
        log.error(
            "model %s: its provider key file %s is empty, has several lines, or has "
            "characters other than visible ASCII",
            model,
            path,
        )
        raise key_unreadable(model)
    return key


def prepare(
    replica: Replica, body: bytes, extra: tuple[tuple[str, str], ...]
) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """The request as the provider gets it: its model name, and its key."""
    ext = replica.external
    assert ext is not None
    data = json.loads(body)
    data["model"] = ext.provider_model
    payload = protocol.encode(data)
    if ext.key_file is not None:
        extra = (*extra, ("authorization", f"Bearer {read_key(replica.service, ext.key_file)}"))
    return payload, extra


def sync(routing: RoutingTable, externals: dict[str, ExternalModel]) -> None:
    """Publish each external model as its one replica; forget those removed."""
    for service in routing.services():
        for r in routing.replicas(service):
            if r.external is not None and externals.get(service) != r.external:
                routing.forget(service, r.pg_id)
    for name, ext in externals.items():
        current = routing.replicas(name)
        if len(current) == 1 and current[0].external == ext:
            continue
        routing.publish(
            Replica(
                pg_id=GROUP_PREFIX + name,
                service=name,
                base_url=ext.url,
                authorization="",
                capacity=ext.concurrency,
                external=ext,
            )
        )
