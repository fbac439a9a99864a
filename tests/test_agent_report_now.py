"""A child reports at once, not at its next heartbeat, when the main placed
work for it (the main asks on the child's agent plane, which only the main may
use) and when one of its engines changes state: a load on demand on a child
waits for the engine, not for heartbeats. The agent's report loop runs against
a stand-in main (tests/test_agent_reports.py); the cluster test runs it all
over mutual TLS (tests/test_capacity_cluster.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from cryptography.hazmat.primitives import serialization

from letsinfer.agent import runtime
from letsinfer.agent.api import REPORT_NOW_PATH, create_agent_app
from letsinfer.agent.supervisor import EngineStatus
from letsinfer.authority.install import Placement
from letsinfer.capacity.controller import CapacityController
from letsinfer.capacity.placing import Found
from letsinfer.capacity.policy import ScalingPolicy
from letsinfer.config import CapacitySettings
from letsinfer.gateway.routing import RoutingTable
from letsinfer.trust import pki
from letsinfer.trust.peer import _with_tls
from tests.test_agent_reports import HeldMain, agent, main, placed  # noqa: F401


# -- the route: only the main may ask ---------------------------------------------
def _der(ca: tuple[object, object], kind: str, subject: str, role: str | None) -> bytes:
    key = pki.new_key()
    cert = pki.issue(
        ca[0],  # type: ignore[arg-type]
        ca[1],  # type: ignore[arg-type]
        key.public_key(),
        kind=kind,
        subject_id=subject,
        role=role,  # type: ignore[arg-type]
        days=1,
    )
    return cert.public_bytes(serialization.Encoding.DER)


def test_only_the_main_may_make_a_child_report_now(tmp_path: Path) -> None:
    """The child's main gets its report at once; another child of the same
    cluster, or a controller, is refused 403 and the refusal counted."""
    ca = pki.create_ca("cluster")
    asked: list[str] = []
    denied: list[tuple[str, str, str]] = []
    app = create_agent_app(
        None,  # type: ignore[arg-type]  # (only the enrollment paths use the home)
        lambda: SimpleNamespace(  # type: ignore[arg-type,return-value]
            node_id="n1", name="n1", role="child", main_id="m1", enrolled=True
        ),
        lambda: "fp",
        SimpleNamespace(),  # type: ignore[arg-type]
        SimpleNamespace(note=lambda who, action, why: denied.append((who, action, why))),  # type: ignore[arg-type]
        on_report_now=lambda: asked.append("now"),
    )

    async def post(der: bytes) -> httpx.Response:
        transport = httpx.ASGITransport(app=_with_tls(app, der))
        async with httpx.AsyncClient(transport=transport, base_url="https://n1:8444") as client:
            return await client.post(REPORT_NOW_PATH)

    async def scenario() -> None:
        for kind, subject, role in (("node", "n2", "child"), ("controller", "alice", None)):
            resp = await post(_der(ca, kind, subject, role))
            assert resp.status_code == 403, resp.text
            assert asked == []
        assert [(who, action) for who, action, _ in denied] == [
            ("node:n2", "agent:request"),
            ("controller:alice", "agent:request"),
        ]
        resp = await post(_der(ca, "node", "m1", "main"))
        assert resp.status_code == 200, resp.text
        assert asked == ["now"]

    asyncio.run(scenario())


# -- the child's report loop ---------------------------------------------------------
async def _until(check: Callable[[], bool]) -> None:
    async def polled() -> None:
        while not check():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(polled(), 5)


def test_the_main_asking_and_an_engine_changing_state_each_send_a_report_at_once(
    main: HeldMain,  # noqa: F811
) -> None:
    """With a heartbeat a minute long, the next report goes at once when the
    main asks (its answer carries the new placement) and again when the
    engine it started changes state."""

    async def scenario() -> None:
        node, engines = agent()
        node.settings.control.heartbeat_interval_s = 60.0  # type: ignore[attr-defined]
        reporting = asyncio.create_task(node._report())
        try:
            _, answer = await main.next()
            answer.set_result(placed())
            node.report_now()  # the route's callback: the main placed pg-a here
            _, asked = await main.next()
            asked.set_result(placed("pg-a"))
            await _until(lambda: len(engines.applied) == 2)  # the engine starts
            node.engine_changed(EngineStatus("pg-a", "ready", base_url="http://10.0.0.2:9000"))
            _, ready = await main.next()
            ready.set_result(placed("pg-a"))
            await _until(lambda: len(engines.applied) == 3)
            assert engines.applied == [[], ["pg-a"], ["pg-a"]]
        finally:
            reporting.cancel()

    asyncio.run(scenario())


def test_a_flapping_engine_makes_one_early_report_not_one_per_change(
    main: HeldMain,  # noqa: F811
) -> None:
    """Changes while a report is under way, or before the gap since the last
    one has passed, all go with one report."""

    async def scenario() -> None:
        node, _ = agent()
        node.settings.control.heartbeat_interval_s = 60.0  # type: ignore[attr-defined]
        reporting = asyncio.create_task(node._report())
        try:
            _, answer = await main.next()
            for i in range(50):
                state = ("starting", "restarting", "failed")[i % 3]
                node.engine_changed(EngineStatus("pg-a", state))
            answer.set_result(placed())
            _, early = await main.next()  # one, for all fifty
            early.set_result(placed())
            await asyncio.sleep(2 * runtime.EARLY_REPORT_GAP_S)
            assert main.reports.empty(), "a second report for the same changes"
        finally:
            reporting.cancel()

    asyncio.run(scenario())


def test_engine_changes_do_not_hurry_a_main_that_sheds_reports(
    main: HeldMain,  # noqa: F811
) -> None:
    """After a 503 the child keeps the pace the main asked for: engines
    changing state across a fleet must not add reports to a busy main."""

    async def scenario() -> None:
        node, _ = agent()
        node.settings.control.heartbeat_interval_s = 60.0  # type: ignore[attr-defined]
        reporting = asyncio.create_task(node._report())
        try:
            _, answer = await main.next()
            answer.set_result(httpx.Response(503, headers={"retry-after": "60"}))
            await asyncio.sleep(0.05)  # the loop takes the answer in
            node.engine_changed(EngineStatus("pg-a", "ready"))
            await asyncio.sleep(2 * runtime.EARLY_REPORT_GAP_S)
            assert main.reports.empty(), "an engine change hurried a busy main"
        finally:
            reporting.cancel()

    asyncio.run(scenario())


def test_an_early_report_waits_out_the_gap_since_the_last_one() -> None:
    gap = runtime.EARLY_REPORT_GAP_S
    assert runtime.early_report_wait(0.0, 60.0) == gap
    assert runtime.early_report_wait(gap / 5, 60.0) == pytest.approx(gap * 4 / 5)
    assert runtime.early_report_wait(gap, 60.0) == 0.0
    # Never later than the heartbeat would have sent it.
    assert runtime.early_report_wait(0.0, gap / 10) == pytest.approx(gap / 10)


# -- the main asks after placing ------------------------------------------------------
class _Placer:
    """Every load goes to ``node``; nothing ever becomes ready."""

    def __init__(self, node: SimpleNamespace) -> None:
        self.node = node
        self.loaded: list[str] = []
        self.settings = SimpleNamespace(main_id="main", fresh_within_s=30.0)
        self.store = SimpleNamespace(
            get_node=lambda node_id, facts=False: SimpleNamespace(
                state="active", facts_at=time.time()
            ),
            list_placement_groups=lambda: [],
        )

    def find(self, service: str) -> Found:
        release = SimpleNamespace(id="r1")
        return Found(Placement(self.node, release, ()), ())  # type: ignore[arg-type]

    def never_fits(self, service: str) -> None:
        return None

    def load(self, service: str, placement: Placement, reason: str) -> str:
        self.loaded.append(placement.node.name)
        return f"pg-{len(self.loaded)}"

    def unload(self, service: str, pg: str, action: str, why: str) -> bool:
        return True

    def refused(self, service: str, why: str) -> None:
        pass


@pytest.mark.parametrize(("node", "asked"), [("n1", ["n1"]), ("main", [])])
def test_the_main_asks_a_child_it_placed_a_load_on_to_report_now(
    node: str, asked: list[str]
) -> None:
    """Right after committing a load on a child the controller asks it to
    report (never the main itself, whose engines it starts directly)."""

    async def scenario() -> None:
        placer = _Placer(SimpleNamespace(id=node, name=node, address="10.0.0.2:8444"))
        told: list[str] = []
        names = {
            "cold": SimpleNamespace(
                scaling=ScalingPolicy(min_groups=0), groups=(), running=True, canary=None
            )
        }
        directory = SimpleNamespace(
            current=lambda: SimpleNamespace(names=names, services=[], system_stopped=False)
        )
        controller = CapacityController(
            placer,  # type: ignore[arg-type]
            RoutingTable(),
            directory,  # type: ignore[arg-type]
            lambda: None,
            CapacitySettings(),
            placed_on=lambda n: told.append(n.name),
        )
        controller.admission = SimpleNamespace(  # type: ignore[assignment]
            depth=lambda service=None: 1, refuse_waiters=lambda service, error: None
        )
        assert controller.admit_load("cold")
        try:
            while not placer.loaded:
                await asyncio.sleep(0.01)
            assert told == asked
        finally:
            await controller.aclose()

    asyncio.run(scenario())
