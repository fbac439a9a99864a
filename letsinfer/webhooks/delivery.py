"""One attempt at a delivery, and when the next one is due.

An attempt is a POST of the event's body with this attempt's signature
headers; redirects are never followed (a 3xx is a failed attempt), and the
destination is checked against ``[fetch] allow_networks`` at each connection
(letsinfer.fetch). 2xx: delivered. 410 Gone: the endpoint asks for no more
(the dispatcher disables it). Anything else, or no answer: retried later.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from letsinfer.fetch import FetchRefused
from letsinfer.webhooks.signing import headers

GONE = 410


@dataclass(frozen=True)
class Attempt:
    status: str  # the HTTP status, or what went wrong, as `webhook deliveries` shows it
    delivered: bool
    gone: bool = False  # 410: disable the endpoint


async def attempt(
    client: httpx.AsyncClient, url: str, secret: str, delivery_id: str, body: str
) -> Attempt:
    """POST once; never raises for what the endpoint or the network did."""
    try:
        answer = await client.post(
            url,
            content=body.encode(),
            headers=headers(secret, delivery_id, body),
            follow_redirects=False,
        )
    except FetchRefused as exc:
        return Attempt(f"refused: {exc}"[:300], delivered=False)
    except httpx.TimeoutException:
        return Attempt("timed out", delivered=False)
    except httpx.HTTPError as exc:
        return Attempt(f"{type(exc).__name__}: {exc}"[:300], delivered=False)
    code = answer.status_code
    return Attempt(str(code), delivered=200 <= code < 300, gone=code == GONE)


def retry_delay(attempts: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential back-off with jitter after ``attempts`` failed attempts:
    about base, 2 base, 4 base... up to ``max_s``, each between half and all
    of it, so endpoints that failed together are not retried together."""
    ceiling = min(max_s, base_s * 2 ** max(0, attempts - 1))
    return ceiling * (0.5 + rng.random() / 2)
