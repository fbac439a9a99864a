"""A real gateway (uvicorn on 127.0.0.1) in front of mock engines, in this process.

Everything server-side runs in one background event loop, so tests can read
the mocks' counters and the routing table directly, while they talk to the
gateway over HTTP like any client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from benchmarks.mock_upstream import MockBehaviour, MockUpstream
from letsinfer.authority.apikeys import create_key
from letsinfer.batched_writes import BatchedWrites
from letsinfer.config import GatewaySettings, TracingSettings
from letsinfer.gateway.app import Gateway, create_app, direct_path
from letsinfer.gateway.directory import Directory
from letsinfer.gateway.routing import Replica, RoutingTable
from letsinfer.store import AuthorityStore
from letsinfer.usage.recorder import RequestLog

T = TypeVar("T")
MODEL = "mock"


class GatewayHarness:
    def __init__(
        self,
        tmp_path: Path,
        engines: dict[str, MockBehaviour],
        *,
        capacity: int = 4,
        keys: dict[str, int | None] | None = None,
        tracing: TracingSettings | None = None,
        policies: dict[str, dict[str, Any]] | None = None,
        records: bool = False,
        **settings: Any,
    ) -> None:
        """``policies``: a key's band, limits and cache (apikeys.check_policy);
        ``records``: keep request records in ``tmp_path``. A harness started
        again on the same ``tmp_path`` finds its store, keys and records (a
        gateway restart)."""
        db = tmp_path / "authority.db"
        secrets_file = tmp_path / "keys.json"
        again = db.exists()
        self.store = AuthorityStore(db)
        if again:
            self.keys = json.loads(secrets_file.read_text())
        else:
            self.store.add_service(MODEL, "0" * 64, 0, "gguf", None, aliases=("mock-alias",))
            self.keys = {
                name: create_key(
                    self.store, name, concurrency=limit, policy=(policies or {}).get(name)
                ).secret
                for name, limit in (keys or {"alice": None, "bob": None}).items()
            }
            secrets_file.write_text(json.dumps(self.keys))
        self.settings = GatewaySettings(metrics_port=0, **settings)
        self.routing = RoutingTable()
        self.directory = Directory(self.store)
        self.directory.refresh()
        self.records = RequestLog(tmp_path / "requests.db") if records else None
        self.gateway = Gateway.build(
            self.directory, self.routing, self.settings, records=self.records, tracing=tracing
        )
        self.engines = engines
        self.capacity = capacity
        self.mocks: dict[str, MockUpstream] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: uvicorn.Server | None = None
        self.port = 0

    # -- lifecycle -------------------------------------------------------------
    def __enter__(self) -> GatewayHarness:
        self._thread.start()
        self.call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self.store.close()

    async def _start(self) -> None:
        if self.records is not None:
            self._writer = asyncio.ensure_future(self.records.run())
        self.gateway.read_counts()  # as the node does as it starts
        for pg_id, behaviour in self.engines.items():
            mock = await MockUpstream(behaviour).start()
            self.mocks[pg_id] = mock
            self.publish(pg_id)
        app = create_app(self.gateway)
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_config=None,
            access_log=False,
            lifespan="off",
            # As the node serves it: the inference POSTs answered without ASGI,
            # the answers' writes batched per turn of the loop.
            http=type(
                "GatewayHttpTools", (*direct_path(app), BatchedWrites, HttpToolsProtocol), {}
            ),
        )
        self._server = uvicorn.Server(config)
        self._serving = asyncio.ensure_future(self._server.serve())
        deadline = time.monotonic() + 10
        while not self._server.started:
            if self._serving.done() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            await asyncio.wait_for(self._serving, 10)
        for mock in self.mocks.values():
            await mock.close()
        await self.gateway.aclose()
        if self.records is not None:  # what is left is written as it stops
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer

    # -- helpers ---------------------------------------------------------------
    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` in the servers' loop and return its result."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=30)

    def in_loop(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        return self.call(run())

    def publish(self, pg_id: str, service: str = MODEL, **facts: Any) -> None:
        mock = self.mocks[pg_id]
        self.routing.publish(
            Replica(
                pg_id=pg_id,
                service=service,
                base_url=mock.url,
                authorization=f"Bearer engine-key-{pg_id}",
                capacity=self.capacity,
                **facts,
            )
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def auth(self, key: str = "alice") -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[key]}"}

    def replica(self, pg_id: str, service: str = MODEL) -> Replica:
        return next(r for r in self.routing.replicas(service) if r.pg_id == pg_id)

    def refresh(self) -> None:
        """Apply what the test wrote to the store (as the node's background refresh does)."""
        self.in_loop(lambda: self.directory.refresh(force=True))

    def wait_until(self, check: Callable[[], bool], timeout: float = 10) -> None:
        """Poll ``check`` in the servers' loop until true (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.in_loop(check):
                return
            time.sleep(0.01)
        raise AssertionError(f"condition not met within {timeout}s")


def chat(stream: bool = False, content: str = "Say something.", **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        **extra,
    }
