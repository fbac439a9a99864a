"""One lifecycle operation at a time on a main, its refusals answered as HTTP
(for the admin socket's routes: letsinfer.lifecycle.routes, weight_routes)."""

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import HTTPException

from letsinfer.authority import lifecycle
from letsinfer.lifecycle import rollout
from letsinfer.lifecycle.serving import Busy, Serving


async def exclusively(sv: Serving, what: str, work: Callable[[], Awaitable[Any]]) -> Any:
    """``work`` alone (one lifecycle operation at a time), its refusals as HTTP."""
    try:
        async with sv.exclusive(what):
            return await work()
    except Busy as exc:
        raise HTTPException(409, str(exc)) from exc
    except rollout.RolloutRefused as exc:
        raise HTTPException(exc.status, f"{exc}. Nothing changed.") from exc
    except lifecycle.NotFound as exc:
        raise HTTPException(404, f"{exc}. Nothing changed.") from exc
    except lifecycle.Refused as exc:
        raise HTTPException(409, f"{exc}. Nothing changed.") from exc
