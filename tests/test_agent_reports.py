"""The agent's report loop (``AgentNode._report``, the real loop) against a main
whose answers the test holds back: what an answer that arrives late may still
change, and when ``report_soon`` returns. The main's transport, the facts'
contents and the engines are stand-ins; the cluster tests run the same loop
over mutual TLS against a real main."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from letsinfer.agent import runtime
from letsinfer.agent.runtime import AgentNode


class HeldMain:
    """Stands in for the agent's ClusterClient: each report waits until the test answers it."""

    def __init__(self) -> None:
        self.reports: asyncio.Queue[tuple[int, asyncio.Future[httpx.Response]]] = asyncio.Queue()

    def __call__(self, *args: object, **kwargs: object) -> HeldMain:  # ClusterClient(...)
        return self

    async def arequest(self, method: str, url: str, json: Any = None) -> httpx.Response:
        answer: asyncio.Future[httpx.Response] = asyncio.get_running_loop().create_future()
        await self.reports.put((json["seq"], answer))
        return await answer

    async def next(self) -> tuple[int, asyncio.Future[httpx.Response]]:
        return await asyncio.wait_for(self.reports.get(), 5)

    async def aclose(self) -> None:
        pass


def placed(*groups: str) -> httpx.Response:
    return httpx.Response(200, json={"placements": [{"pg_id": g} for g in groups]})


class Engines:
    """The node's placements and engines: what was asked of them, in order."""

    def __init__(self) -> None:
        self.applied: list[list[str]] = []
        self.runners: dict[str, object] = {"pg-a": object()}

    def apply(self, desired: list[dict[str, str]], fetch: object = None) -> None:
        self.applied.append([d["pg_id"] for d in desired])
        self.runners = {d["pg_id"]: object() for d in desired}

    async def close(self) -> None:
        self.runners = {}


@pytest.fixture
def main(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldMain]:
    held = HeldMain()
    monkeypatch.setattr(runtime, "ClusterClient", held)
    monkeypatch.setattr(runtime.pki, "read_private_key", lambda path: None)
    monkeypatch.setattr(runtime, "sign", lambda facts, key: {"seq": facts})
    monkeypatch.setattr(runtime, "from_wire", lambda d, *engine: d)
    yield held


def agent() -> tuple[AgentNode, Engines]:
    node = AgentNode.__new__(AgentNode)
    engines = Engines()
    node.identity = SimpleNamespace(main_id="m", main_address="10.0.0.1:8443", name="n1")  # type: ignore[assignment]
    node.files = SimpleNamespace(key="key.pem")  # type: ignore[assignment]
    node.settings = SimpleNamespace(  # type: ignore[assignment]
        control=SimpleNamespace(heartbeat_interval_s=0.05),
        engine=SimpleNamespace(threads=1, context=512, parallel=1),
    )
    node.placements = engines  # type: ignore[assignment]
    node.supervisor = engines  # type: ignore[assignment]
    node.audit = SimpleNamespace(append_audit=lambda *a, **k: None)  # type: ignore[assignment]
    node.desired = []
    node.groups = None
    node.revoked = frozenset()
    node._removal = None
    node._removal_began = 0.0
    node._report_now = asyncio.Event()
    node._reported = asyncio.Event()
    node._main_answering = True
    node._built = node._sent = 0

    async def no_loads(timeout_s: float) -> dict[str, object]:
        return {}

    async def not_due(client: object, url: str) -> None:
        pass

    node._engine_loads = no_loads  # type: ignore[method-assign,assignment]
    node._facts = lambda seq, loads=None: seq  # type: ignore[method-assign,assignment,return-value]
    node._renew_if_due = not_due  # type: ignore[method-assign]
    return node, engines


def test_an_answer_from_before_the_removal_never_starts_the_engines_again(
    main: HeldMain,
) -> None:
    """The main answered a report, then committed the node's removal and told
    the node, which stopped its engines; the answer, slow on the wire, arrives
    after that. Its placements are the main's word from before: dropped."""

    async def scenario() -> None:
        node, engines = agent()
        reporting = asyncio.create_task(node._report())
        try:
            _, answer = await main.next()  # a report in flight
            assert await node.removed("main:m") == 1  # the notice: engines stopped
            answer.set_result(placed("pg-a"))  # the answer computed before the removal
            await main.next()  # the loop went on past it
            assert engines.applied == [[]] and engines.runners == {}
        finally:
            reporting.cancel()

    asyncio.run(scenario())


def test_report_soon_waits_for_facts_built_after_it_is_called(main: HeldMain) -> None:
    """Called while a report is in flight (its facts built before, say, a
    model file was deleted), report_soon returns only once a report built
    after the call has been answered."""

    async def scenario() -> None:
        node, _ = agent()
        reporting = asyncio.create_task(node._report())
        try:
            first, answer = await main.next()
            soon = asyncio.create_task(node.report_soon(timeout=5))
            await asyncio.sleep(0)
            answer.set_result(placed())
            second, fresh = await main.next()  # sent at once, not after the interval
            assert second > first
            assert not soon.done(), "returned on the answer to facts built before the call"
            fresh.set_result(placed())
            await asyncio.wait_for(soon, 1)
        finally:
            reporting.cancel()

    asyncio.run(scenario())
