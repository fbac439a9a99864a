"""An opt-in response cache: exact answers again, for keys that ask for it.

Only keys with a cache TTL reach this module (the request path checks
``key.cache is not None`` and nothing else). An answer is cached when all of
these hold:

- the request is not streamed (streams pass through untouched and say
  ``x-letsinfer-cache: bypass``: replaying a stream at once would change its
  timing, and holding it whole would break "chunk by chunk, never buffered");
- its temperature is 0, or the key asks for sampled answers to be cached too
  (an unset temperature is the engine's default, which samples);
- the client did not send ``Cache-Control: no-cache`` (then the request reaches
  the engine, and its fresh answer replaces the cached one) or ``no-store``
  (the same, and the answer is not kept);
- the answer is a 200 and fits the cache's per-entry bound.

The cache key is a SHA-256 over the API key (its digest, not its name: a name
given to a new key once the old one is revoked starts with an empty cache),
the endpoint, the model that serves (so an alias and its model share entries)
and the request itself in a canonical form (sorted keys, no ``user``,
``stream`` or ``stream_options``): so the same question in other JSON
spelling hits, and one API key never learns from the cache what another
asked. An entry is served while younger than the key's TTL as it is now (a
TTL shortened, or a cache turned off and on, applies to what is kept), and
the least recently used go first once the cache holds ``max_bytes``, each
entry counted with what keeping it costs beyond its bytes. Nothing is written
to disk: a restart empties it.
"""

from __future__ import annotations

import collections
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

HIT = b"hit"
MISS = b"miss"
BYPASS = b"bypass"

_NOT_PART = frozenset({"user", "stream", "stream_options"})


@dataclass(frozen=True)
class CachePolicy:
    ttl_s: int
    sampled: bool = False  # cache answers sampled at a non-zero temperature too


# What an entry costs beyond its answer's bytes (its key, the entry and the
# table's slot, in CPython), so that many tiny answers, or empty ones, cannot
# grow the cache past its bound.
ENTRY_OVERHEAD = 256


@dataclass(frozen=True)
class Cached:
    body: bytes
    content_type: bytes
    stored: float  # the cache's clock when it was kept

    @property
    def cost(self) -> int:
        return len(self.body) + len(self.content_type) + ENTRY_OVERHEAD


def cache_key(
    key: str, endpoint: str, model: str, identity: str, request: Mapping[str, Any]
) -> bytes:
    """``model``: the name it answers to; ``identity``: what answers under it
    (letsinfer.gateway.directory.ServiceEntry.identity)."""
    canonical = {k: v for k, v in request.items() if k not in _NOT_PART}
    canonical["model"] = [model, identity]
    # (ASCII: a lone surrogate, valid in JSON, has no UTF-8 form)
    text = json.dumps([key, endpoint, canonical], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).digest()


def eligible(policy: CachePolicy, stream: bool, temperature: float | None, embedding: bool) -> bool:
    if stream:
        return False
    if embedding or policy.sampled:
        return True
    return temperature == 0


def directives(header: bytes | None) -> frozenset[bytes]:
    """A Cache-Control request header's directive names, lower case (its
    lines joined with commas, as HTTP reads repeated lines)."""
    if not header:
        return frozenset()
    return frozenset(d.strip().split(b"=", 1)[0].lower() for d in header.split(b","))


class ResponseCache:
    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.max_entry = max(1, max_bytes // 8)  # one answer never takes the whole cache
        self.clock = clock
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._entries: collections.OrderedDict[bytes, Cached] = collections.OrderedDict()

    def get(self, key: bytes, ttl_s: float) -> Cached | None:
        """The entry kept under ``key`` if younger than ``ttl_s``."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        if entry.stored + ttl_s <= self.clock():
            self._drop(key)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: bytes, body: bytes, content_type: bytes) -> None:
        entry = Cached(body, content_type, self.clock())
        if key in self._entries:  # even when the new answer is too big to keep: never the old
            self._drop(key)
        if entry.cost > self.max_entry:
            return
        self._entries[key] = entry
        self.size += entry.cost
        while self.size > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: bytes) -> None:
        self.size -= self._entries.pop(key).cost

    def __len__(self) -> int:
        return len(self._entries)
