"""How busy an engine is, in its own words: free slots and waiting requests.

llama.cpp's server (bundled or a ``llama-server`` binary; letsinfer always
starts it with its slots and metrics endpoints on) lists its slots at
``/slots`` (``is_processing`` per slot) and counts the requests no slot could
take yet as ``llamacpp:requests_deferred`` at ``/metrics``. Both need the
engine key. An engine that answers neither (another runtime, a busy or dying
one) reports None, never a guess.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

_DEFERRED = "llamacpp:requests_deferred"


@dataclass(frozen=True)
class EngineLoad:
    slots_free: int | None = None
    queue_depth: int | None = None


def free_slots(slots: object) -> int | None:
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        return None
    return sum(1 for s in slots if not s.get("is_processing"))


def deferred(metrics: str) -> int | None:
    for line in metrics.splitlines():
        if line.startswith(_DEFERRED + " "):
            try:
                return max(0, int(float(line.split()[1])))
            except (IndexError, ValueError):
                return None
    return None


async def read_load(client: httpx.AsyncClient, base_url: str, engine_key: str) -> EngineLoad:
    auth = {"authorization": f"Bearer {engine_key}"}

    async def get(path: str) -> httpx.Response | None:
        try:
            response = await client.get(base_url + path, headers=auth)
        except httpx.HTTPError:
            return None
        return response if response.status_code == 200 else None

    slots, metrics = await asyncio.gather(get("/slots"), get("/metrics"))
    free = None
    if slots is not None:
        try:
            free = free_slots(slots.json())
        except ValueError:
            free = None
    return EngineLoad(free, deferred(metrics.text) if metrics is not None else None)


async def read_loads(
    client: httpx.AsyncClient, engines: Iterable[tuple[str, str, str]]
) -> dict[str, EngineLoad]:
    """``engines``: (pg id, base URL, engine key) of each ready serving engine."""
    engines = list(engines)
    loads = await asyncio.gather(*(read_load(client, url, key) for _, url, key in engines))
    return {pg_id: load for (pg_id, _, _), load in zip(engines, loads, strict=True)}
