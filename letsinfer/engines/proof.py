"""Proof that an engine serves: beyond ``/health``, one real answer.

A health check says the server listens and its model loaded; only a real
request says the model computes. An engine is proven by one one-token
completion, or one embedding for an embedding model, before anything is
routed to it (at every start, and before ``model add`` admits a file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx

KINDS = ("completion", "embedding")


@dataclass(frozen=True)
class ProofRequest:
    path: str
    body: bytes
    authorization: str | None  # "Bearer <engine key>"; None: the engine has no key


def proof_request(kind: str, engine_key: str | None) -> ProofRequest:
    if kind == "embedding":
        path, body = "/v1/embeddings", {"input": "letsinfer proof"}
    elif kind == "completion":
        path, body = "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
    else:
        raise ValueError(f"no proof for a model of kind {kind!r}")
    return ProofRequest(
        path, json.dumps(body).encode(), f"Bearer {engine_key}" if engine_key else None
    )


def _answered(path: str, data: object) -> bool:
    if not isinstance(data, dict):
        return False
    if path == "/v1/embeddings":
        items = data.get("data")
        return bool(items) and bool(items[0].get("embedding"))
    choices = data.get("choices")
    return bool(choices) and "text" in choices[0]


def _headers(req: ProofRequest) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if req.authorization:
        headers["authorization"] = req.authorization
    return headers


def _verdict(req: ProofRequest, resp: httpx.Response) -> str | None:
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.status_code == 200 and _answered(req.path, data):
        return None
    said = " ".join(resp.text.split())[:300]
    return f"proof request {req.path} answered HTTP {resp.status_code}: {said}"


async def prove(
    client: httpx.AsyncClient, base_url: str, req: ProofRequest, timeout: float
) -> str | None:
    """None when the engine answered; otherwise what went wrong, in a line."""
    try:
        resp = await client.post(
            base_url + req.path, content=req.body, headers=_headers(req), timeout=timeout
        )
    except httpx.HTTPError as exc:
        return f"proof request {req.path} failed: {exc!r}"
    return _verdict(req, resp)


def prove_now(client: httpx.Client, base_url: str, req: ProofRequest, timeout: float) -> str | None:
    """:func:`prove`, for callers without an event loop."""
    try:
        resp = client.post(
            base_url + req.path, content=req.body, headers=_headers(req), timeout=timeout
        )
    except httpx.HTTPError as exc:
        return f"proof request {req.path} failed: {exc!r}"
    return _verdict(req, resp)
