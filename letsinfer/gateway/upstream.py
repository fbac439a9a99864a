"""Forwarding one request to an engine replica.

Retries go to another replica only while nothing has been sent to the client.
Once streaming has begun, an upstream failure ends the stream with an error
event, never a silent cut.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable

import httpx
from starlette.responses import Response, StreamingResponse

from letsinfer.gateway.errors import GatewayError, no_replica, upstream_timeout
from letsinfer.gateway.routing import Replica, RoutingTable

log = logging.getLogger("letsinfer.gateway")

Finish = Callable[[int, Replica | None], None]  # (status, replica) -> access log


def _stream_error_event(message: str) -> bytes:
    body = {
        "error": {
            "message": message,
            "type": "server_error",
            "param": None,
            "code": "upstream_stream_error",
        }
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Upstream:
    def __init__(
        self, routing: RoutingTable, connect_timeout_s: float, read_timeout_s: float
    ) -> None:
        self.routing = routing
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def forward(
        self,
        service: str,
        path: str,
        body: bytes,
        stream: bool,
        request_id: str,
        finish: Finish,
    ) -> Response:
        tried: set[str] = set()
        failures: list[str] = []
        while True:
            replica = self.routing.choose(service, frozenset(tried))
            if replica is None:
                detail = "; ".join(failures) if failures else self.routing.explain(service)
                raise no_replica(service, detail)
            tried.add(replica.pg_id)
            replica.in_flight += 1
            request = self.client.build_request(
                "POST",
                replica.base_url + path,
                content=body,
                headers={
                    "authorization": replica.authorization,
                    "content-type": "application/json",
                    "x-request-id": request_id,
                },
            )
            try:
                resp = await self.client.send(request, stream=True)
            except httpx.TimeoutException as exc:
                replica.in_flight -= 1
                if isinstance(exc, httpx.ConnectTimeout):
                    failures.append(f"{replica.pg_id}: connect timeout")
                    continue
                raise upstream_timeout(service) from exc
            except httpx.HTTPError as exc:
                # Nothing reached the client yet: another replica may answer.
                replica.in_flight -= 1
                failures.append(f"{replica.pg_id}: {type(exc).__name__}")
                continue
            if resp.status_code == 503:  # engine still loading or overloaded
                await resp.aclose()
                replica.in_flight -= 1
                failures.append(f"{replica.pg_id}: engine answered 503")
                continue
            if stream and resp.status_code == 200:
                return StreamingResponse(
                    self._relay(resp, replica, finish),
                    status_code=200,
                    media_type="text/event-stream",
                    headers={"x-request-id": request_id, "cache-control": "no-cache"},
                )
            try:
                content = await resp.aread()
            except httpx.TimeoutException as exc:
                raise upstream_timeout(service) from exc
            except httpx.HTTPError as exc:
                raise GatewayError(
                    502,
                    f"Model '{service}' failed while answering: {type(exc).__name__}.",
                    type_="server_error",
                    code="upstream_error",
                ) from exc
            finally:
                await resp.aclose()
                replica.in_flight -= 1
            finish(resp.status_code, replica)
            return Response(
                content,
                status_code=resp.status_code,
                media_type=resp.headers.get("content-type", "application/json"),
                headers={"x-request-id": request_id},
            )

    async def _relay(
        self, resp: httpx.Response, replica: Replica, finish: Finish
    ) -> AsyncIterator[bytes]:
        status = 200
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            status = 502
            log.warning("stream from %s broke: %s", replica.pg_id, exc)
            yield _stream_error_event(f"the model's stream broke: {type(exc).__name__}")
        finally:
            replica.in_flight -= 1
            await resp.aclose()
            finish(status, replica)
