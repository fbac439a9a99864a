"""The gateway's breadth, against mock engines: priority bands and fair turns,
rate limits and budgets (and their restart), the response cache, LoRA
adapters by name, external providers and fallbacks."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.mock_upstream import MockBehaviour
from letsinfer.authority.apikeys import create_key, digest, set_policy
from letsinfer.authority.external import add_external_model, set_fallback
from letsinfer.authority.lifecycle import set_model_desired
from letsinfer.gateway import gateway as gateway_module
from letsinfer.gateway.cache import ENTRY_OVERHEAD, ResponseCache
from letsinfer.gateway.errors import GatewayError
from letsinfer.gateway.limits import KeyLimits, Limiter, estimate_prompt, period_bounds
from letsinfer.store.requests import RequestStore
from tests.gateway_harness import MODEL, GatewayHarness, chat
from tests.nodes import free_port
from tests.provider import ANSWER, Provider

QUICK = MockBehaviour(tokens=8)  # usage: 5 prompt + 8 completion tokens a request


def post(h: GatewayHarness, key: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(
        h.url + "/v1/chat/completions", json=body, headers={**h.auth(key), **headers}, timeout=30
    )


def arrivals(h: GatewayHarness, pg: str = "pg-a") -> list[str]:
    """The request ids in the order the engine saw them."""
    return list(h.mocks[pg].stats.request_ids)


# -- priority bands and fair turns ----------------------------------------------


def gated(h: GatewayHarness) -> None:
    async def close() -> None:
        h.mocks["pg-a"].gate = asyncio.Event()

    h.call(close())


def open_gate(h: GatewayHarness) -> None:
    h.in_loop(lambda: h.mocks["pg-a"].gate.set())  # type: ignore[union-attr]


async def send_all(h: GatewayHarness, sends: list[tuple[str, str]]) -> list[httpx.Response]:
    """Send (key, request id) pairs at once; their responses when all are answered."""
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(
            *(
                client.post(
                    h.url + "/v1/chat/completions",
                    json=chat(),
                    headers={**h.auth(key), "x-request-id": rid},
                )
                for key, rid in sends
            )
        )


def test_an_interactive_key_waits_one_turn_behind_fifty_batch_requests(tmp_path: Path) -> None:
    with GatewayHarness(
        tmp_path,
        {"pg-a": QUICK},
        capacity=1,
        keys={"crawler": None, "human": None},
        policies={"crawler": {"band": "batch"}, "human": {"band": "interactive"}},
    ) as h:
        gated(h)
        adm = h.gateway.admission
        batch = [("crawler", f"batch-{i}") for i in range(50)]

        async def scenario() -> list[httpx.Response]:
            held = asyncio.create_task(send_all(h, batch))
            while adm.depth() < 49:
                await asyncio.sleep(0.01)
            # The band is the key's: a client's own idea of its priority changes nothing.
            async with httpx.AsyncClient(timeout=60) as client:
                human = asyncio.create_task(
                    client.post(
                        h.url + "/v1/chat/completions",
                        json=chat(),
                        headers={**h.auth("human"), "x-request-id": "human"},
                    )
                )
                while adm.depth() < 50:
                    await asyncio.sleep(0.01)
                open_gate(h)
                return [await human, *(await held)]

        answers = asyncio.run(scenario())
        assert [r.status_code for r in answers] == [200] * 51
        order = arrivals(h)
        assert len(order) == 51 and order[0].startswith("batch-")
        # The one batch request at the engine finishes; the slot is the human's.
        assert order[1] == "human"


def test_two_keys_in_one_band_alternate_whatever_their_connections(tmp_path: Path) -> None:
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, capacity=1, keys={"holder": None, "many": None, "few": None}
    ) as h:
        gated(h)
        adm = h.gateway.admission
        sends = [("many", f"many-{i}") for i in range(12)]
        sends += [("few", f"few-{i}") for i in range(3)]

        async def scenario() -> list[httpx.Response]:
            holder = asyncio.create_task(send_all(h, [("holder", "hold")]))
            while h.mocks["pg-a"].stats.in_flight < 1:
                await asyncio.sleep(0.01)
            task = asyncio.create_task(send_all(h, sends))
            while adm.depth() < 15:
                await asyncio.sleep(0.01)
            open_gate(h)
            return [*(await holder), *(await task)]

        assert {r.status_code for r in asyncio.run(scenario())} == {200}
        keys = [rid.split("-")[0] for rid in arrivals(h)]
        assert keys[0] == "hold"
        assert keys[1:7] == ["many", "few"] * 3 or keys[1:7] == ["few", "many"] * 3
        assert keys[7:] == ["many"] * 9


def test_a_full_queue_makes_room_for_a_higher_band_and_for_a_key_with_fewer_waiting(
    tmp_path: Path,
) -> None:
    with GatewayHarness(
        tmp_path,
        {"pg-a": QUICK},
        capacity=1,
        keys={"crawler": None, "human": None, "many": None, "few": None},
        policies={"crawler": {"band": "batch"}, "human": {"band": "interactive"}},
        queue_max_waiting=4,
    ) as h:
        gated(h)
        adm = h.gateway.admission

        async def scenario() -> dict[str, httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                sent: dict[str, asyncio.Future[httpx.Response]] = {}

                async def send(key: str, rid: str) -> None:
                    """One more request; back once it is answered, waiting or at the engine."""
                    sent[rid] = asyncio.ensure_future(
                        client.post(
                            h.url + "/v1/chat/completions",
                            json=chat(),
                            headers={**h.auth(key), "x-request-id": rid},
                        )
                    )
                    at_engine = h.mocks["pg-a"].stats.in_flight
                    while sum(f.done() for f in sent.values()) + adm.depth() + at_engine < len(
                        sent
                    ):
                        await asyncio.sleep(0.01)
                        at_engine = h.mocks["pg-a"].stats.in_flight

                for i in range(5):  # one at the engine, and a queue full of one batch key
                    await send("crawler", f"batch-{i}")
                await send("human", "human")  # takes the newest batch waiter's place
                await send("crawler", "batch-5")  # no place: it outranks nobody
                for i in range(3):  # a higher band than batch: each takes a batch place
                    await send("many", f"many-{i}")
                for i in range(2):  # one band: a key with two more waiting gives way
                    await send("few", f"few-{i}")
                open_gate(h)
                return {rid: await f for rid, f in sent.items()}

        answers = asyncio.run(scenario())
        refused_ = sorted(rid for rid, r in answers.items() if r.status_code != 200)
        for rid in refused_:
            assert refused(answers[rid], "queue_full") >= 1
        # The human took batch-4's place, "many" took the other batch keys'
        # places, newest first, and "few" one of its three: then many had two
        # and few one, and neither outranked the other.
        assert refused_ == [f"batch-{i}" for i in range(1, 6)] + ["few-1", "many-2"]
        assert arrivals(h) == ["batch-0", "human", "many-0", "few-0", "many-1"]


# -- rate limits and budgets ------------------------------------------------------


def shift(h: GatewayHarness, seconds: float) -> None:
    """Move the limiter's clock (its windows and periods) ahead."""
    h.gateway.limiter.clock = lambda: time.time() + seconds


def recounted(h: GatewayHarness) -> None:
    """Wait until every recount of limits from the records begun so far is done."""
    h.wait_until(lambda: not h.gateway._reading)


def slow_reads(h: GatewayHarness, seconds: float) -> None:
    """From now on each read of the request records takes ``seconds`` longer
    (a month of records on a busy disk)."""
    assert h.records is not None
    read = h.records._write_then_read

    def slow_read(*args: Any) -> Any:
        time.sleep(seconds)
        return read(*args)

    h.records._write_then_read = slow_read  # type: ignore[method-assign]


@contextlib.contextmanager
def spent_past_budget(tmp_path: Path) -> Iterator[GatewayHarness]:
    """Key ``team`` with 39 tokens spent of its 30 a day, counted."""
    policies = {"team": {"budget_tokens": 30, "budget_period": "day"}}
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies, records=True
    ) as h:
        assert [post(h, "team", chat()).status_code for _ in range(3)] == [200] * 3  # 39
        recounted(h)
        yield h


def refused(r: httpx.Response, code: str) -> int:
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == code, r.text
    return int(r.headers["retry-after"])


def test_requests_per_minute_refuse_the_next_until_the_window_moves(tmp_path: Path) -> None:
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, keys={"rpm2": None, "free": None}, policies={"rpm2": {"rpm": 2}}
    ) as h:
        assert [post(h, "rpm2", chat()).status_code for _ in range(2)] == [200, 200]
        third = post(h, "rpm2", chat())
        wait = refused(third, "rate_limit_exceeded")
        assert 1 <= wait <= 60 and "2 requests per minute" in third.json()["error"]["message"]
        assert post(h, "free", chat()).status_code == 200  # other keys are not affected
        assert h.mocks["pg-a"].stats.requests == 3, "the refused request reached no engine"
        shift(h, wait + 0.5)
        assert post(h, "rpm2", chat()).status_code == 200


def test_tokens_per_minute_count_what_requests_used(tmp_path: Path) -> None:
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, keys={"tpm": None}, policies={"tpm": {"tpm": 20}}
    ) as h:
        # 13 tokens each: the second starts under 20 and ends over it (26).
        assert post(h, "tpm", chat()).status_code == 200
        streamed = post(h, "tpm", chat(stream=True))  # counted from its usage event
        assert streamed.status_code == 200 and '"usage"' not in streamed.text
        h.wait_until(lambda: h.gateway.limiter._keys["tpm"].in_window >= 26)
        wait = refused(post(h, "tpm", chat()), "rate_limit_exceeded")
        assert 1 <= wait <= 60
        shift(h, wait + 0.5)
        assert post(h, "tpm", chat()).status_code == 200


def test_a_spent_budget_is_refused_until_its_period_ends_and_after_a_restart(
    tmp_path: Path,
) -> None:
    policies = {"team": {"budget_tokens": 30, "budget_period": "day"}}
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies, records=True
    ) as h:
        assert [post(h, "team", chat()).status_code for _ in range(3)] == [200] * 3  # 39 tokens
        r = post(h, "team", chat())
        wait = refused(r, "budget_exhausted")
        assert r.json()["error"]["type"] == "insufficient_quota"
        end = period_bounds("day", time.time())[1]
        assert abs(wait - (end - time.time())) <= 5  # until the next UTC midnight
    # The gateway restarts: the spent budget comes back from the request records.
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, records=True) as h:
        refused(post(h, "team", chat()), "budget_exhausted")  # (it waits for the read)
        assert h.gateway.limiter.spent("team") == 39
        assert h.mocks["pg-a"].stats.requests == 0
        shift(h, wait + 1)  # the next day
        assert post(h, "team", chat()).status_code == 200


def test_a_restarted_gateway_serves_at_once_and_a_limited_key_once_its_spending_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A month of records takes seconds to read: the gateway does not wait for
    it to serve, but a limited key is never let through on counts that miss
    what it spent before the restart, however long the read takes."""
    monkeypatch.setattr(gateway_module, "RECOUNT_WARN_S", 0.2)
    policies = {"team": {"budget_tokens": 30, "budget_period": "day"}}
    with GatewayHarness(
        tmp_path,
        {"pg-a": QUICK},
        keys={"team": None, "free": None},
        policies=policies,
        records=True,
    ) as h:
        assert [post(h, "team", chat()).status_code for _ in range(3)] == [200] * 3  # 39 tokens
    restarted = GatewayHarness(tmp_path, {"pg-a": QUICK}, records=True)
    assert restarted.records is not None
    read, disk = restarted.records._write_then_read, threading.Event()

    def stalled_read(*args: Any) -> Any:
        disk.wait(60)  # a disk that answers only when the test says so
        return read(*args)

    restarted.records._write_then_read = stalled_read  # type: ignore[method-assign]
    with restarted as h, ThreadPoolExecutor(1) as pool:
        try:
            assert post(h, "free", chat()).status_code == 200  # served while the read stalls
            waiting = pool.submit(post, h, "team", chat())
            h.wait_until(lambda: "team" in h.gateway._slow)  # waited long enough to be logged
            time.sleep(0.5)  # (time enough to reach the engine, were it let through)
            assert not waiting.done() and h.mocks["pg-a"].stats.requests == 1  # free's alone
        finally:
            disk.set()
        refused(waiting.result(), "budget_exhausted")
        assert h.gateway.limiter.spent("team") == 39
        assert h.mocks["pg-a"].stats.requests == 1


def test_limits_set_while_serving_count_what_the_key_already_used(tmp_path: Path) -> None:
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, keys={"late": None}, records=True) as h:
        assert [post(h, "late", chat()).status_code for _ in range(2)] == [200, 200]  # 26
        h.store.set_key_policy("late", {"budget_tokens": 30, "budget_period": "day"})
        h.refresh()
        h.wait_until(lambda: h.gateway.limiter.spent("late") == 26)
        assert post(h, "late", chat()).status_code == 200  # 26 < 30: admitted, ends at 39
        refused(post(h, "late", chat()), "budget_exhausted")


def test_a_request_running_when_its_key_gets_a_budget_is_charged_when_it_ends(
    tmp_path: Path,
) -> None:
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, keys={"late": None}, records=True) as h:
        gated(h)

        async def budget_set_while_one_runs() -> httpx.Response:
            async with httpx.AsyncClient(timeout=30) as client:
                running = asyncio.create_task(
                    client.post(h.url + "/v1/chat/completions", json=chat(), headers=h.auth("late"))
                )
                while h.mocks["pg-a"].stats.in_flight < 1:
                    await asyncio.sleep(0.01)
                # Its record is written when it ends: the recount cannot find it.
                h.store.set_key_policy("late", {"budget_tokens": 20, "budget_period": "day"})
                h.refresh()
                while h.gateway._reading or "late" not in h.gateway.limiter._keys:
                    await asyncio.sleep(0.01)
                open_gate(h)
                return await running

        assert asyncio.run(budget_set_while_one_runs()).status_code == 200
        h.wait_until(lambda: h.gateway.limiter.spent("late") == 13)
        assert post(h, "late", chat()).status_code == 200  # 13 < 20: admitted, ends at 26
        refused(post(h, "late", chat()), "budget_exhausted")


def test_a_limit_changed_while_requests_run_keeps_what_they_hold(tmp_path: Path) -> None:
    policies = {"team": {"budget_tokens": 10_000, "budget_period": "day", "rpm": 3}}
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, capacity=10, keys={"team": None}, policies=policies, records=True
    ) as h:
        assert post(h, "team", chat()).status_code == 200  # 13 tokens, booked
        h.wait_until(lambda: h.gateway.limiter.spent("team") == 13)
        gated(h)
        raw = json.dumps(chat(max_tokens=400)).encode()  # each holds 400 and its prompt
        headers = {**h.auth("team"), "content-type": "application/json"}
        url = h.url + "/v1/chat/completions"

        async def change_while_two_run() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                running = [
                    asyncio.create_task(client.post(url, content=raw, headers=headers))
                    for _ in range(2)
                ]
                while h.mocks["pg-a"].stats.in_flight < 2:
                    await asyncio.sleep(0.01)
                # An unrelated change: the key's counts are read again from the records.
                h.store.set_key_policy("team", {"tpm": 100_000})
                h.refresh()
                await asyncio.sleep(0.3)
                # Its minute still holds three requests, and its budget two estimates.
                over_rpm = await client.post(url, content=raw, headers=headers)
                held = 2 * (400 + estimate_prompt(raw))
                h.store.set_key_policy("team", {"rpm": None, "budget_tokens": 13 + held})
                h.refresh()
                await asyncio.sleep(0.3)
                over_budget = await client.post(url, content=raw, headers=headers)
                open_gate(h)
                return [over_rpm, over_budget, *await asyncio.gather(*running)]

        over_rpm, over_budget, *done = asyncio.run(change_while_two_run())
        assert [r.status_code for r in done] == [200, 200]
        refused(over_rpm, "rate_limit_exceeded")
        refused(over_budget, "budget_exhausted")  # 13 spent + 2 x (400 + prompt) held
        assert "in progress" in over_budget.json()["error"]["message"]
        h.wait_until(lambda: h.gateway.limiter.spent("team") == 39)  # each charged once
        assert h.gateway.limiter._keys["team"].held == 0


def test_two_limit_changes_during_one_slow_read_count_the_records_once(tmp_path: Path) -> None:
    policies = {"team": {"budget_tokens": 1_000, "budget_period": "day"}}
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies, records=True
    ) as h:
        for _ in range(3):
            assert post(h, "team", chat()).status_code == 200
        h.wait_until(lambda: h.gateway.limiter.spent("team") == 39)
        slow_reads(h, 0.3)
        off = {"budget_tokens": None, "rpm": None, "tpm": None}
        on = {"budget_tokens": 1_000, "budget_period": "day"}
        for changes in ([{"rpm": 100}, {"tpm": 100_000}], [off, on, off, on]):
            for change in changes:
                h.store.set_key_policy("team", change)
                h.refresh()
                time.sleep(0.1)  # the second begins while the first still reads
            recounted(h)
            assert h.gateway.limiter.spent("team") == 39
            assert len(h.gateway.limiter._keys["team"].requests) == 3


def test_requests_the_disk_could_not_take_still_count_when_limits_are_read_again(
    tmp_path: Path,
) -> None:
    policies = {"team": {"budget_tokens": 45, "budget_period": "day"}}
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies, records=True
    ) as h:
        recounted(h)
        assert h.records is not None and h.records._store is not None
        store = h.records._store

        def full(*args: Any) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        store.insert_many = full  # type: ignore[method-assign]
        assert [post(h, "team", chat()).status_code for _ in range(3)] == [200] * 3  # 39
        h.store.set_key_policy("team", {"budget_period": "week"})  # another period: a read
        h.refresh()
        recounted(h)
        assert h.gateway.limiter.spent("team") == 39
        del store.insert_many  # the disk has room again: written once, counted once
        h.wait_until(lambda: h.records.backlog == 0)  # type: ignore[union-attr]
        h.store.set_key_policy("team", {"budget_period": "day"})
        h.refresh()
        recounted(h)
        assert h.gateway.limiter.spent("team") == 39


def test_a_new_number_for_what_is_counted_applies_at_once_with_no_read(tmp_path: Path) -> None:
    # Re-reading the records would leave the counts at zero while it reads: a
    # spent budget would let requests through meanwhile. A change that needs
    # no count not kept already (a budget's amount, a token rate) reads nothing.
    policies = {"team": {"budget_tokens": 30, "budget_period": "day", "rpm": 100}}
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies, records=True
    ) as h:
        assert [post(h, "team", chat()).status_code for _ in range(3)] == [200] * 3  # 39
        recounted(h)
        assert h.records is not None
        reads: list[object] = []
        read = h.records._write_then_read

        def counted_read(*args: Any) -> Any:
            reads.append(args)
            return read(*args)

        h.records._write_then_read = counted_read  # type: ignore[method-assign]
        for change in ({"tpm": 100_000}, {"budget_tokens": 35}, {"rpm": 50, "tpm": None}):
            h.store.set_key_policy("team", change)
            h.refresh()
            refused(post(h, "team", chat()), "budget_exhausted")  # at once: 39 of 35
        assert h.gateway.limiter.spent("team") == 39 and reads == []
        assert len(h.gateway.limiter._keys["team"].requests) == 3
        h.store.set_key_policy("team", {"budget_period": "week"})  # another period: read
        h.refresh()
        recounted(h)
        assert len(reads) == 1 and h.gateway.limiter.spent("team") == 39


def test_a_request_refused_before_its_limits_saw_it_is_not_counted_after_a_restart(
    tmp_path: Path,
) -> None:
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies={"team": {"rpm": 3}}, records=True
    ) as h:
        assert [post(h, "team", {"model": MODEL}).status_code for _ in range(4)] == [400] * 4
        assert post(h, "team", chat() | {"model": "nope"}).status_code == 404
        for _ in range(3):  # a client that leaves before its body is whole
            with socket.create_connection(("127.0.0.1", h.port)) as sock:
                sock.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n"
                    b"authorization: Bearer " + h.keys["team"].encode() + b"\r\n\r\n{"
                )
        assert [post(h, "team", chat()).status_code for _ in range(2)] == [200, 200]
    left = RequestStore(tmp_path / "requests.db", readonly=True).conn.execute(
        "SELECT COUNT(*) FROM requests WHERE status = 499 AND pg IS NULL"
    )
    assert left.fetchone()[0] == 3
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, records=True) as h:
        assert post(h, "team", chat()).status_code == 200  # the third of its minute
        refused(post(h, "team", chat()), "rate_limit_exceeded")


def test_a_request_queued_when_its_key_is_revoked_is_refused(
    tmp_path: Path,
) -> None:
    from letsinfer.authority.apikeys import revoke_key

    keys = {"alice": None, "bob": None}
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, capacity=1, keys=keys) as h:
        gated(h)  # alice's request holds the only slot; bob's waits

        async def queued() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                url = h.url + "/v1/chat/completions"
                first = asyncio.ensure_future(
                    client.post(url, json=chat(), headers=h.auth("alice"))
                )
                while h.mocks["pg-a"].stats.in_flight < 1:
                    await asyncio.sleep(0.01)
                waiting = asyncio.ensure_future(
                    client.post(url, json=chat(), headers=h.auth("bob"))
                )
                while h.in_loop(lambda: h.gateway.admission.depth()) < 1:
                    await asyncio.sleep(0.01)
                revoke_key(h.store, "bob")
                h.refresh()
                open_gate(h)
                return [await first, await waiting]

        alice, bob = asyncio.run(queued())
        assert alice.status_code == 200
        assert bob.status_code == 401 and bob.json()["error"]["code"] == "invalid_api_key"
        assert h.mocks["pg-a"].stats.requests == 1  # only alice's reached the engine
        assert h.in_loop(lambda: h.routing.replicas(MODEL)[0].in_flight) == 0


def test_a_providers_own_429_counts_for_requests_per_minute_and_after_a_restart(
    tmp_path: Path,
) -> None:
    # It reached the provider: a client hammering a provider that is already
    # limiting it must still be held to its key's --rpm.
    policies = {"team": {"rpm": 3}}
    with beside_a_provider(
        tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies, records=True
    ) as (provider, h, key_file):
        publish_external(h, provider.url, key_file)
        provider.outage = (429, {"retry-after": "7"})
        for _ in range(2):
            r = post(h, "team", chat() | {"model": "ext"})
            assert r.status_code == 429 and r.json()["error"]["code"] == "outage"
        provider.outage = None
        assert post(h, "team", chat() | {"model": "ext"}).status_code == 200
        refused(post(h, "team", chat() | {"model": "ext"}), "rate_limit_exceeded")
        assert len(provider.seen) == 3
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, records=True) as h:
        refused(post(h, "team", chat()), "rate_limit_exceeded")  # still three this minute
        assert h.mocks["pg-a"].stats.requests == 0


def test_a_stream_cut_before_its_usage_is_charged_an_estimate_not_nothing(
    tmp_path: Path,
) -> None:
    # (8 s of stream: the client leaves after 10 events, however slow this machine)
    slow = MockBehaviour(tokens=400, interval_s=0.02)
    policies = {"team": {"budget_tokens": 10_000, "budget_period": "day", "tpm": 10_000}}
    with GatewayHarness(
        tmp_path, {"pg-a": slow}, keys={"team": None}, policies=policies, records=True
    ) as h:
        body = json.dumps(chat(stream=True)).encode()
        headers = {**h.auth("team"), "content-type": "application/json"}
        with httpx.stream(
            "POST", h.url + "/v1/chat/completions", content=body, headers=headers, timeout=30
        ) as r:
            got = b""
            for part in r.iter_bytes():
                got += part
                if got.count(b"data: ") >= 10:
                    break  # the client leaves long before the usage event
        h.wait_until(lambda: h.gateway.limiter.spent("team") > 0)
        spent = h.gateway.limiter.spent("team")
        relayed = got.count(b"data: ")
        # The prompt's estimate (its body's bytes / 4) and a token per event sent.
        assert relayed <= spent - estimate_prompt(body) < 400
        assert h.gateway.limiter._keys["team"].in_window == spent  # tpm alike
    # A restart counts the charge again, from the request's record.
    with GatewayHarness(tmp_path, {"pg-a": slow}, records=True) as h:
        recounted(h)
        assert h.gateway.limiter.spent("team") == spent
        assert h.gateway.limiter._keys["team"].in_window == spent
        (row,) = RequestStore(tmp_path / "requests.db", readonly=True).find(
            r.headers["x-request-id"]
        )
        assert row.charged == spent and row.completion_tokens is None  # not passed off as usage


def test_work_an_engine_did_is_charged_when_its_answer_is_cut_off_and_a_refusal_is_not(
    tmp_path: Path,
) -> None:
    slow = MockBehaviour(tokens=200, interval_s=0.01)  # a whole answer after 2 s
    policies = {"team": {"budget_tokens": 100_000, "budget_period": "day"}}
    with beside_a_provider(
        tmp_path, {"pg-a": slow}, keys={"team": None}, policies=policies, upstream_timeout_s=1
    ) as (provider, h, key_file):
        spent = h.gateway.limiter.spent
        raw = json.dumps(chat(max_tokens=200)).encode()
        url, headers = (
            h.url + "/v1/chat/completions",
            {**h.auth("team"), "content-type": "application/json"},
        )
        r = httpx.post(url, content=raw, headers=headers, timeout=30)
        assert r.json()["error"]["code"] == "upstream_timeout"
        h.wait_until(lambda: spent("team") > 0)
        assert spent("team") == estimate_prompt(raw)
        # The client gives up while the engine works: charged too.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, content=raw, headers=headers, timeout=0.5)
        h.wait_until(lambda: spent("team") == 2 * estimate_prompt(raw))
        assert h.mocks["pg-a"].stats.requests == 2

        # A provider that refuses the work (429, 5xx) did none: nothing is charged.
        publish_external(h, provider.url, key_file)
        before = spent("team")
        for status in (429, 500):
            provider.outage = (status, {})
            for stream in (False, True):
                r = post(h, "team", chat(stream=stream) | {"model": "ext"})
                assert r.status_code == status
        assert spent("team") == before


def test_a_fallback_whose_engine_times_out_is_charged_and_booked_where_it_ran(
    tmp_path: Path,
) -> None:
    slow = MockBehaviour(tokens=200, interval_s=0.01)
    policies = {"team": {"budget_tokens": 100_000, "budget_period": "day"}}
    with GatewayHarness(
        tmp_path,
        {"pg-a": QUICK, "pg-b": slow},
        keys={"team": None},
        policies=policies,
        records=True,
        upstream_timeout_s=1,
    ) as h:
        h.store.add_service("big", "8" * 64, 0, "gguf", None)
        set_fallback(h.store, MODEL, "big")
        h.refresh()
        h.in_loop(lambda: h.routing.forget(MODEL, "pg-b"))
        h.publish("pg-b", service="big")
        h.in_loop(lambda: h.routing.withdraw(MODEL, "pg-a", "engine exited"))
        raw = json.dumps(chat(max_tokens=200)).encode()
        headers = {**h.auth("team"), "content-type": "application/json", "x-request-id": "slow"}
        r = httpx.post(h.url + "/v1/chat/completions", content=raw, headers=headers, timeout=30)
        assert r.status_code == 503 and "big" not in r.text  # the model asked for's error
        h.wait_until(lambda: h.gateway.limiter.spent("team") == estimate_prompt(raw))
    (row,) = RequestStore(tmp_path / "requests.db", readonly=True).find("slow")
    assert (row.model, row.pg, row.charged) == ("big", "pg-b", estimate_prompt(raw))


def test_a_spent_budget_stays_spent_while_a_change_has_its_counts_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # While the read runs, memory holds none of what it reads (Limiter.recount):
    # a request let through once it had waited a while would go on zero.
    monkeypatch.setattr(gateway_module, "RECOUNT_WARN_S", 0.1)
    with spent_past_budget(tmp_path) as h:
        slow_reads(h, 0.5)  # five times that
        h.store.set_key_policy("team", {"budget_period": "week"})  # another period: a read

        def change_seen() -> bool:
            h.directory.refresh(force=True)
            return "team" in h.gateway.recounting  # from the change on, before the read begins

        assert h.in_loop(change_seen)
        # Sent while its counts are being read: it waits for them, and is refused.
        refused(post(h, "team", chat()), "budget_exhausted")
        assert h.gateway.limiter.spent("team") == 39 and not h.gateway.recounting
        assert h.mocks["pg-a"].stats.requests == 3


def test_limits_cleared_and_set_again_while_a_request_runs_keep_the_new_holds() -> None:
    limiter = Limiter(clock=lambda: 1_000_000.0)
    budget = KeyLimits(budget=1_000, period="day")
    old = limiter.admit("team", budget, prompt=10, max_tokens=300)
    limiter.forget("team")  # limits cleared...
    limiter.recount("team", budget)  # ...and set again, with two requests under them
    new = [limiter.admit("team", budget, prompt=10, max_tokens=200) for _ in range(2)]
    limiter.settle(old, 50)  # the request of the old limits ends: charged, holding nothing
    assert limiter._keys["team"].held == 420 and limiter.spent("team") == 50
    # The new ones still hold 420 of the 950 left: one more asking 600 waits.
    with pytest.raises(GatewayError) as held:
        limiter.admit("team", budget, prompt=10, max_tokens=590)
    assert held.value.code == "budget_exhausted"
    for done in new:
        limiter.settle(done, 100)
    assert limiter._keys["team"].held == 0 and limiter.spent("team") == 250


def test_a_long_request_across_midnight_counts_the_same_after_a_restart(tmp_path: Path) -> None:
    """Tokens are charged when a request ends: a 70 s request that began before
    midnight UTC spends the new day's budget and the current minute's tokens,
    in memory and, after a restart, from its record alike."""
    from letsinfer.store.requests import RequestRecord

    midnight = period_bounds("day", 1_000_000.0)[1]
    clock = [midnight - 30]
    limits = KeyLimits(rpm=10, tpm=1_000, budget=1_000, period="day")
    running = Limiter(clock=lambda: clock[0])
    admitted = running.admit("team", limits, prompt=10)
    clock[0] = midnight + 40
    running.settle(admitted, 100)
    clock[0] = midnight + 50  # its arrival has left the minute, its tokens have not
    with pytest.raises(GatewayError) as before:
        running.admit("team", KeyLimits(tpm=100))

    store = RequestStore(tmp_path / "requests.db")
    store.insert_many(
        [RequestRecord(midnight - 30, "r1", "team", "m", "pg-1", "n1", "chat", False, 200,
                       60, 40, 5.0, 70_000.0, 0.0)]
    )  # fmt: skip
    restarted = Limiter(clock=lambda: clock[0])
    generation = restarted.recount("team", limits)
    spent, recent = store.key_usage({"team": midnight}, clock[0] - 60)["team"]
    restarted.restore("team", limits, spent, recent, generation, midnight)
    with pytest.raises(GatewayError) as after:
        restarted.admit("team", KeyLimits(tpm=100))
    assert restarted.spent("team") == running.spent("team") == 100
    assert after.value.message == before.value.message  # the same minute's tokens, same wait
    assert len(restarted._keys["team"].requests) == len(running._keys["team"].requests) == 0
    store.close()


def test_a_recount_read_across_midnight_leaves_the_old_days_tokens_out() -> None:
    """The records are read for the day the read began in; when it ends in
    the next day, what it found was that day's spending, not the new one's."""
    midnight = period_bounds("day", 1_000_000.0)[1]
    clock = [midnight - 0.5]
    limiter = Limiter(clock=lambda: clock[0])
    limits = KeyLimits(budget=1_000, period="day")
    start = limiter.period_start(limits, clock[0])
    generation = limiter.recount("team", limits)
    clock[0] = midnight + 0.5  # a read of a second, across midnight UTC
    limiter.restore("team", limits, 900, [], generation, start)
    assert limiter.spent("team") == 0
    limiter.admit("team", limits, prompt=10, max_tokens=500)  # the new day's budget is whole


def test_a_request_that_waited_through_two_limit_changes_is_held_to_the_last(
    tmp_path: Path,
) -> None:
    with spent_past_budget(tmp_path) as h:
        slow_reads(h, 0.5)

        async def across_two_changes() -> httpx.Response:
            async with httpx.AsyncClient(timeout=30) as client:
                h.store.set_key_policy("team", {"budget_period": "week"})
                h.refresh()
                # Sent while the week is read: it waits, knowing its key's week.
                waiting = asyncio.ensure_future(
                    client.post(h.url + "/v1/chat/completions", json=chat(), headers=h.auth("team"))
                )
                await asyncio.sleep(0.2)
                h.store.set_key_policy("team", {"budget_period": "month"})
                h.refresh()
                return await waiting

        # Admitted under the week, it would have started the week's count at zero.
        refused(asyncio.run(across_two_changes()), "budget_exhausted")
        recounted(h)
        assert h.gateway.limiter.spent("team") == 39
        refused(post(h, "team", chat()), "budget_exhausted")


def test_a_request_that_ends_as_its_keys_limits_change_is_counted(tmp_path: Path) -> None:
    from letsinfer.gateway.exchange import Exchange

    policies = {"team": {"budget_tokens": 1_000, "budget_period": "day"}}
    with GatewayHarness(
        tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies, records=True
    ) as h:
        endpoints = h.gateway.book_now.__self__  # type: ignore[attr-defined]
        limits = h.directory.current().keys[digest(h.keys["team"])].limits
        assert limits is not None

        def ends_in_the_turn_of_a_change() -> None:
            ex = Exchange("same-turn", None)
            ex.key, ex.served, ex.pg, ex.status = "team", MODEL, "pg-a", 200
            ex.tail = b'{"usage":{"prompt_tokens":5,"completion_tokens":8}}'
            ex.admitted = h.gateway.limiter.admit("team", limits)
            h.store.set_key_policy("team", {"rpm": 100})
            h.directory.refresh(force=True)  # its recount begins in this turn
            endpoints.record(ex)  # and the request ends in it too

        h.in_loop(ends_in_the_turn_of_a_change)
        recounted(h)
        assert h.gateway.limiter.spent("team") == 13


def test_requests_at_once_cannot_all_start_on_what_is_left_of_a_budget(tmp_path: Path) -> None:
    policies = {"team": {"budget_tokens": 60, "budget_period": "day"}}
    with GatewayHarness(
        tmp_path,
        {"pg-a": MockBehaviour(tokens=8)},
        capacity=20,  # room for all of them: only the budget can hold them back
        keys={"team": None},
        policies=policies,
    ) as h:
        gated(h)  # the engine holds every answer until the gate opens
        body = json.dumps(chat(max_tokens=8)).encode()
        headers = {**h.auth("team"), "content-type": "application/json"}

        async def twenty() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                url = h.url + "/v1/chat/completions"
                tasks = [
                    asyncio.ensure_future(client.post(url, content=body, headers=headers))
                    for _ in range(20)
                ]
                # Every one is either refused or at the engine before any ends.
                while sum(t.done() for t in tasks) + h.mocks["pg-a"].stats.in_flight < 20:
                    await asyncio.sleep(0.01)
                open_gate(h)
                return await asyncio.gather(*tasks)

        answers = asyncio.run(twenty())
        passed = [r for r in answers if r.status_code == 200]
        held = [r for r in answers if r.status_code == 429]
        # Each holds its prompt's estimate and its max_tokens while it runs: as
        # many start as fit in 60 with nothing spent yet, the rest wait.
        each = estimate_prompt(body) + 8
        assert len(passed) == 60 // each and len(held) == 20 - len(passed)
        for r in held:
            assert refused(r, "budget_exhausted") == 1
            assert "requests in progress" in r.json()["error"]["message"]
        # (An answer leaves before its charge: settled just after, not before.)
        h.wait_until(lambda: h.gateway.limiter._keys["team"].held == 0)
        assert h.gateway.limiter.spent("team") == 13 * len(passed)  # (5 + 8 each)
        while (last := post(h, "team", chat(max_tokens=8))).status_code == 200:
            pass  # one at a time, while one more fits
        # Requests that say how much they may write never pass the budget.
        assert 60 - each < h.gateway.limiter.spent("team") <= 60
        assert refused(last, "budget_exhausted") > 60  # nothing in progress: the period's end
        left = 60 - h.gateway.limiter.spent("team")
        assert f"has about {left} left of its budget of 60" in last.json()["error"]["message"]


def test_a_request_that_may_write_more_than_the_budget_has_left_is_refused(
    tmp_path: Path,
) -> None:
    policies = {"team": {"budget_tokens": 1000, "budget_period": "day"}}
    with GatewayHarness(
        tmp_path, {"pg-a": MockBehaviour(tokens=8)}, keys={"team": None}, policies=policies
    ) as h:
        # However a request says how much the model may write (llama.cpp reads
        # n_predict first, a provider max_completion_tokens or max_tokens), the
        # largest counts; one that may write more than is left never starts,
        # and one that may write more than the whole budget is a bad request
        # (no Retry-After could help it).
        for more in (
            {"max_tokens": 5000},
            {"max_tokens": 1, "max_completion_tokens": 5000},
            {"max_tokens": 1, "n_predict": 5000},
        ):
            r = post(h, "team", chat(stream=True) | more)
            assert r.status_code == 400 and "retry-after" not in r.headers, more
            error = r.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_value", "max_tokens")
            assert "whole day (1000 tokens)" in error["message"]
        assert h.mocks["pg-a"].stats.requests == 0
        team = h.in_loop(lambda: h.gateway.limiter._keys["team"])
        assert (team.spent, team.held, len(team.requests)) == (0, 0, 0)  # nothing counted
        # One that fits starts and holds what it may write while it runs.
        gated(h)

        async def held_while_running() -> int:
            async with httpx.AsyncClient(timeout=60) as client:
                task = asyncio.ensure_future(
                    client.post(
                        h.url + "/v1/chat/completions",
                        json=chat() | {"max_tokens": 1, "n_predict": 700},
                        headers=h.auth("team"),
                    )
                )
                while h.mocks["pg-a"].stats.in_flight < 1:
                    await asyncio.sleep(0.01)
                held = h.in_loop(lambda: h.gateway.limiter._keys["team"].held)
                open_gate(h)
                assert (await task).status_code == 200
                return held

        assert asyncio.run(held_while_running()) >= 700


def test_a_providers_whole_answer_without_usage_is_charged_for_its_size(tmp_path: Path) -> None:
    policies = {"team": {"budget_tokens": 100_000, "budget_period": "day"}}
    with beside_a_provider(tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies) as (
        provider,
        h,
        key_file,
    ):
        publish_external(h, provider.url, key_file)
        provider.usage = False  # (some providers never say)
        r = post(h, "team", chat() | {"model": "ext"})
        assert r.status_code == 200 and "usage" not in r.json()
        h.wait_until(lambda: h.gateway.limiter.spent("team") > 0)
        body = json.dumps(chat() | {"model": "ext"}, separators=(",", ":")).encode()
        # Its prompt's estimate and its answer at four bytes a token, not the prompt alone.
        assert h.gateway.limiter.spent("team") >= estimate_prompt(body) + len(r.content) // 4 - 2


def test_a_request_refused_for_concurrency_does_not_use_up_the_minute(tmp_path: Path) -> None:
    policies = {"one": {"rpm": 2}}
    with GatewayHarness(
        tmp_path, {"pg-a": MockBehaviour(tokens=8)}, keys={"one": 1}, policies=policies
    ) as h:
        gated(h)

        async def two_at_once() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                first = asyncio.ensure_future(
                    client.post(h.url + "/v1/chat/completions", json=chat(), headers=h.auth("one"))
                )
                while h.mocks["pg-a"].stats.in_flight < 1 and not first.done():  # holds the slot
                    await asyncio.sleep(0.01)
                second = await client.post(
                    h.url + "/v1/chat/completions", json=chat(), headers=h.auth("one")
                )
                open_gate(h)
                return [await first, second]

        first, second = asyncio.run(two_at_once())
        assert first.status_code == 200
        refused(second, "concurrency_limit_exceeded")
        # The refused one did not count: the key still has its second request.
        assert post(h, "one", chat()).status_code == 200
        refused(post(h, "one", chat()), "rate_limit_exceeded")


# -- the response cache ------------------------------------------------------------


def test_the_cache_answers_a_repeat_with_the_same_bytes_and_no_tokens(tmp_path: Path) -> None:
    policies = {
        "cached": {"cache_ttl_s": 300, "tpm": 1000},
        "other": {"cache_ttl_s": 300},
    }
    with GatewayHarness(
        tmp_path,
        {"pg-a": QUICK},
        keys={"cached": None, "other": None, "plain": None},
        policies=policies,
        records=True,
    ) as h:
        stats = h.mocks["pg-a"].stats
        ask = chat(temperature=0, content="What is 2+2?")
        first = post(h, "cached", ask, **{"x-request-id": "first"})
        assert first.headers["x-letsinfer-cache"] == "miss"
        # The answer reaches the client just before the gateway charges the key.
        h.wait_until(lambda: h.gateway.limiter._keys["cached"].in_window > 0)
        spent = h.gateway.limiter._keys["cached"].in_window
        # The same question in other JSON spelling (key order, spaces) hits.
        same = json.dumps(dict(reversed(list(ask.items()))), indent=1)
        second = httpx.post(
            h.url + "/v1/chat/completions",
            content=same,
            headers={**h.auth("cached"), "x-request-id": "second"},
        )
        assert second.headers["x-letsinfer-cache"] == "hit"
        assert second.content == first.content
        assert stats.requests == 1, "a hit reaches no engine"
        assert h.gateway.limiter._keys["cached"].in_window == spent, "a hit costs no tokens"

        fresh = post(h, "cached", ask, **{"cache-control": "no-cache"})
        assert fresh.headers["x-letsinfer-cache"] == "bypass" and stats.requests == 2
        sampled = post(h, "cached", chat(content="What is 2+2?"))  # the engine's default: samples
        assert sampled.headers["x-letsinfer-cache"] == "bypass" and stats.requests == 3
        streamed = post(h, "cached", {**ask, "stream": True})
        assert streamed.headers["x-letsinfer-cache"] == "bypass" and stats.requests == 4
        # Another key never gets this key's answers; a key without a cache, no header.
        assert post(h, "other", ask).headers["x-letsinfer-cache"] == "miss"
        assert "x-letsinfer-cache" not in post(h, "plain", ask).headers
        assert stats.requests == 6

        # no-store: fresh, and not kept; the directive counts on any header line.
        private = chat(temperature=0, content="A private question.")
        for lines in (
            [("cache-control", "no-store")],
            [("cache-control", "max-age=0"), ("Cache-Control", "No-Store")],
        ):
            answer = httpx.post(
                h.url + "/v1/chat/completions",
                json=private,
                headers=[*h.auth("cached").items(), *lines],
            )
            assert answer.headers["x-letsinfer-cache"] == "bypass"
        assert stats.requests == 8
        assert post(h, "cached", private).headers["x-letsinfer-cache"] == "miss"
        assert stats.requests == 9

    rows = {r.request_id: r for r in RequestStore(tmp_path / "requests.db").find("second")}
    hit = rows["second"]
    assert hit.cached and hit.status == 200 and hit.pg is None
    assert (hit.prompt_tokens, hit.completion_tokens) == (0, 0)
    miss = RequestStore(tmp_path / "requests.db").find("first")[0]
    assert not miss.cached and miss.completion_tokens == 8


def test_the_cache_is_bounded_and_entries_expire(tmp_path: Path) -> None:
    with GatewayHarness(
        tmp_path,
        {"pg-a": QUICK},
        keys={"k": None},
        policies={"k": {"cache_ttl_s": 60}},
        cache_max_bytes=8192,
    ) as h:
        for i in range(40):  # more answers than the cache holds
            post(h, "k", chat(temperature=0, content=f"question {i}"))
        cache = h.gateway.cache
        assert 0 < cache.size <= 8192 and len(cache) < 40
        last = chat(temperature=0, content="question 39")
        assert post(h, "k", last).headers["x-letsinfer-cache"] == "hit"
        assert (
            post(h, "k", chat(temperature=0, content="question 0")).headers["x-letsinfer-cache"]
            == "miss"
        ), "the least recently used went first"
        cache.clock = lambda: time.monotonic() + 61
        assert post(h, "k", last).headers["x-letsinfer-cache"] == "miss"

        # A shorter TTL, or the cache turned off and on, applies to what is kept.
        assert post(h, "k", last).headers["x-letsinfer-cache"] == "hit"  # kept again at +61
        cache.clock = lambda: time.monotonic() + 61 + 30
        set_policy(h.store, "k", {"cache_ttl_s": 20})
        h.refresh()
        assert post(h, "k", last).headers["x-letsinfer-cache"] == "miss"  # 30 s old
        for ttl in (None, 3600):
            set_policy(h.store, "k", {"cache_ttl_s": ttl})
            h.refresh()
        cache.clock = lambda: time.monotonic() + 61 + 30 + 10
        assert post(h, "k", last).headers["x-letsinfer-cache"] == "hit"  # 10 s old, TTL 1 h

    # Empty answers (a provider's `200 {}`, say) cost their keeping: they cannot
    # grow the cache past its bound.
    tiny = ResponseCache(16 << 10)
    for i in range(2000):
        tiny.put(str(i).encode(), b"", b"application/json")
    assert 0 < tiny.size <= 16 << 10 and len(tiny) <= (16 << 10) // ENTRY_OVERHEAD

    # A fresh answer too big to keep (after `no-cache`, say) still replaces the
    # old one: the next request must not get the answer it was meant to refresh.
    tiny.put(b"asked", b"old answer", b"application/json")
    assert tiny.get(b"asked", 60) is not None
    tiny.put(b"asked", b"x" * (16 << 10), b"application/json")
    assert tiny.get(b"asked", 60) is None


def test_a_stopped_model_or_cluster_gets_nothing_from_the_cache(tmp_path: Path) -> None:
    policies = {"evals": {"cache_ttl_s": 3600}}
    with beside_a_provider(tmp_path, {"pg-a": QUICK}, keys={"evals": None}, policies=policies) as (
        provider,
        h,
        key_file,
    ):
        publish_external(h, provider.url, key_file)
        ask = chat(temperature=0, content="q") | {"model": "ext"}
        assert post(h, "evals", ask).headers["x-letsinfer-cache"] == "miss"
        assert post(h, "evals", ask).headers["x-letsinfer-cache"] == "hit"
        # An administrator stops the provider (a leaked key, a runaway bill):
        # its answers stop too, the cached ones included.
        set_model_desired(h.store, "ext", "stopped", actor="cli")
        h.refresh()
        r = post(h, "evals", ask)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_stopped"
        # With a fallback, the answer comes from it and says the cache was passed by.
        set_fallback(h.store, "ext", MODEL)
        h.refresh()
        r = post(h, "evals", ask)
        assert r.status_code == 200 and r.headers["x-letsinfer-fallback"] == MODEL
        assert r.headers["x-letsinfer-cache"] == "bypass"
        set_fallback(h.store, "ext", None)
        set_model_desired(h.store, "ext", "running", actor="cli")
        h.refresh()
        h.wait_until(lambda: h.routing.ready_count("ext") == 1)
        assert post(h, "evals", ask).headers["x-letsinfer-cache"] == "hit"
        # And a stopped cluster serves nothing.
        h.store.set_cluster_stop({"at": time.time(), "groups": []})
        h.refresh()
        r = post(h, "evals", ask)
        assert r.status_code == 503 and r.json()["error"]["code"] == "system_stopped", r.text
        assert len(provider.seen) == 1


def test_a_new_key_under_a_revoked_keys_name_gets_none_of_its_cached_answers(
    tmp_path: Path,
) -> None:
    from letsinfer.authority.apikeys import revoke_key

    policies = {"team": {"cache_ttl_s": 300}}
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies) as h:
        ask = chat(temperature=0, content="What did the last tenant ask?")
        assert post(h, "team", ask).headers["x-letsinfer-cache"] == "miss"
        assert post(h, "team", ask).headers["x-letsinfer-cache"] == "hit"
        revoke_key(h.store, "team")
        h.keys["team"] = create_key(h.store, "team", policy=policies["team"]).secret
        h.refresh()
        assert post(h, "team", ask).headers["x-letsinfer-cache"] == "miss"
        assert h.mocks["pg-a"].stats.requests == 2


def test_a_model_or_adapter_replaced_under_its_name_gets_none_of_the_old_answers(
    tmp_path: Path,
) -> None:
    policies = {"team": {"cache_ttl_s": 300}}
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, keys={"team": None}, policies=policies) as h:
        h.store.add_adapter("tuned", MODEL, "1" * 64, 1, None)
        h.refresh()
        h.in_loop(lambda: h.routing.set_adapters(MODEL, "pg-a", ("tuned",)))
        ask = chat(temperature=0, content="Which weights answer?")
        for model in (MODEL, "tuned"):
            assert post(h, "team", ask | {"model": model}).headers["x-letsinfer-cache"] == "miss"
            assert post(h, "team", ask | {"model": model}).headers["x-letsinfer-cache"] == "hit"

        h.store.delete_adapter("tuned")
        h.store.add_adapter("tuned", MODEL, "2" * 64, 1, None)  # another file, same name
        h.refresh()
        got = post(h, "team", ask | {"model": "tuned"})
        assert got.headers["x-letsinfer-cache"] == "miss"
        h.store.delete_service(MODEL)
        h.store.add_service(MODEL, "9" * 64, 0, "gguf", None)  # other weights, same name
        h.refresh()
        assert post(h, "team", ask).headers["x-letsinfer-cache"] == "miss"
        assert h.mocks["pg-a"].stats.requests == 4

        # A lone surrogate (valid JSON, no UTF-8 form) is a request like any other.
        lone = '{"model":"mock","temperature":0,"messages":[{"role":"user","content":"\\udfff"}]}'
        headers = h.auth("team")
        url = h.url + "/v1/chat/completions"
        assert httpx.post(url, content=lone, headers=headers).headers["x-letsinfer-cache"] == "miss"
        assert httpx.post(url, content=lone, headers=headers).headers["x-letsinfer-cache"] == "hit"


# -- LoRA adapters by name -----------------------------------------------------------


def test_an_adapter_reaches_only_the_groups_that_loaded_it_with_its_id(tmp_path: Path) -> None:
    engines = {"pg-a": QUICK, "pg-b": QUICK}
    with GatewayHarness(
        tmp_path, engines, keys={"any": None, "base-only": None, "lora-only": None}
    ) as h:
        h.store.add_adapter("mock-lora", MODEL, "1" * 64, 1, None)
        h.store.add_adapter("mock-other", MODEL, "2" * 64, 1, None)
        allow(h, "base-only", MODEL)
        allow(h, "lora-only", "mock-lora")
        h.in_loop(lambda: h.routing.set_adapters(MODEL, "pg-b", ("mock-other", "mock-lora")))

        for _ in range(3):
            assert post(h, "any", chat() | {"model": "mock-lora"}).status_code == 200
        assert h.mocks["pg-a"].stats.requests == 0, "pg-a has not loaded the adapter"
        sent = [json.loads(b) for b in h.mocks["pg-b"].stats.bodies]
        assert {json.dumps(b["lora"]) for b in sent} == {'[{"id": 1, "scale": 1.0}]'}

        models = httpx.get(h.url + "/v1/models", headers=h.auth("any")).json()["data"]
        card = next(m for m in models if m["id"] == "mock-lora")
        assert card["parent"] == MODEL and card["ready_replicas"] == 1

        # Allowlists apply to the adapter on its own.
        denied = post(h, "base-only", chat() | {"model": "mock-lora"})
        assert denied.status_code == 404 and denied.json()["error"]["code"] == "model_not_found"
        tuned = post(h, "lora-only", chat() | {"model": "mock-lora"})
        assert tuned.status_code == 200 and tuned.json()["model"] == "mock-lora"
        assert post(h, "lora-only", chat()).status_code == 404
        # ...and a key that may not use the base is not told its name.
        for listing in (
            httpx.get(h.url + "/v1/models", headers=h.auth("lora-only")).json()["data"],
            [httpx.get(h.url + "/v1/models/mock-lora", headers=h.auth("lora-only")).json()],
        ):
            assert [m["id"] for m in listing] == ["mock-lora"] and "parent" not in listing[0]
        # A client cannot pick adapters by id past its allowlist.
        forged = post(h, "base-only", chat() | {"lora": [{"id": 1, "scale": 1.0}]})
        assert forged.status_code == 400 and forged.json()["error"]["param"] == "lora"
        escaped = httpx.post(
            h.url + "/v1/chat/completions",
            content=json.dumps(chat())[:-1] + ', "lor\\u0061": [{"id": 0, "scale": 1}]}',
            headers=h.auth("base-only"),
        )
        assert escaped.status_code == 400
        assert all("lora" not in json.loads(b) for b in h.mocks["pg-a"].stats.bodies)

        # No group loaded it: a quick 503, not a wait.
        h.in_loop(lambda: h.routing.set_adapters(MODEL, "pg-b", ()))
        gone = post(h, "any", chat() | {"model": "mock-lora"})
        assert gone.status_code == 503 and gone.headers["retry-after"]
        assert "'mock-lora' is not loaded" in gone.json()["error"]["message"]


def test_an_adapter_whose_name_is_taken_meanwhile_or_one_too_many_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from letsinfer.authority import adapters as adapter_authority
    from letsinfer.engines.tinymodel import write_tiny_lora
    from letsinfer.store import AuthorityStore, StoreError

    store = AuthorityStore(tmp_path / "authority.db")
    try:
        store.add_service("base", "0" * 64, 0, "gguf", None)

        def meanwhile(*_: object) -> None:  # another command adds a model by that name
            store.add_service("clash", "1" * 64, 0, "gguf", None)

        monkeypatch.setattr(adapter_authority, "check_fits", meanwhile)
        models = tmp_path / "models"
        lora = write_tiny_lora(tmp_path / "lora.gguf")
        with pytest.raises(StoreError, match="model 'clash' already exists"):
            adapter_authority.add_adapter(store, models, "base", "clash", lora)
        assert store.list_adapters() == []
        assert not [p for p in models.rglob("*") if p.is_file()], "its file is not kept"

        # More than a node's facts can say it loaded (its reports would stop): refused.
        for i in range(adapter_authority.MAX_ADAPTERS):
            store.add_adapter(f"a{i}", "base", f"{i:064x}", 1, None)
        with pytest.raises(StoreError, match="has 64 LoRA adapters"):
            adapter_authority.add_adapter(store, models, "base", "one-more", lora)
        assert len(store.list_adapters("base")) == 64
    finally:
        store.close()


def _lora(path: Path, tensors: dict[str, Any], alpha: float | str = 1.0) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    if isinstance(alpha, str):
        writer.add_string("adapter.lora.alpha", alpha)
    else:
        writer.add_float32("adapter.lora.alpha", alpha)
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Whether llama.cpp's server starts with the adapter loaded (then leaves at
# once: deleting a server that has just started can hang in its shutdown).
_LOADS = """
import os, sys, xllamacpp
params = xllamacpp.CommonParams()
params.model.path, params.hostnames, params.n_ctx = sys.argv[1], ["127.0.0.1"], 256
params.port = int(sys.argv[3])
params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(sys.argv[2], 0.0)]
params.lora_init_without_apply = True
try:
    server = xllamacpp.Server(params)
except Exception:
    sys.exit(1)
os._exit(0)
"""


def test_an_adapter_is_accepted_exactly_when_llama_cpp_loads_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    import numpy as np

    from letsinfer.authority.adapters import AdapterRefused, check_fits, read_adapter
    from letsinfer.engines.tinymodel import write_tiny_lora, write_tiny_model

    base = write_tiny_model(tmp_path / "tiny.gguf")
    embd, vocab = 64, 366  # the tiny model's token_embd.weight, ne0 first

    def zeros(*shape: int) -> Any:
        return np.zeros(shape, np.float32)  # numpy's shape is ggml's, reversed

    cases = {
        "tiny_lora": (write_tiny_lora(tmp_path / "tiny-lora.gguf"), True),
        # The embedding table in llama.cpp's layout (A and B flipped, as
        # convert_lora_to_gguf.py writes it): it loads.
        "embedding": (
            _lora(
                tmp_path / "embd.gguf",
                {
                    "token_embd.weight.lora_a": zeros(vocab, 1),
                    "token_embd.weight.lora_b": zeros(embd, 1),
                },
            ),
            True,
        ),
        # The same in the other matrices' layout: llama.cpp refuses it.
        "embedding_unflipped": (
            _lora(
                tmp_path / "embd-unflipped.gguf",
                {
                    "token_embd.weight.lora_a": zeros(1, embd),
                    "token_embd.weight.lora_b": zeros(vocab, 1),
                },
            ),
            False,
        ),
        # Norm vectors beside the matrices (mergekit writes them): skipped, it loads.
        "with_norm": (
            _lora(
                tmp_path / "norm.gguf",
                {
                    "output.weight.lora_a": zeros(1, embd),
                    "output.weight.lora_b": zeros(vocab, 1),
                    "output_norm.weight": np.ones(embd, np.float32),
                },
            ),
            True,
        ),
        "wrong_rows": (write_tiny_lora(tmp_path / "rows.gguf", rows=vocab + 1), False),
        # Its alpha as text: llama.cpp asserts it is a float, at each start.
        "alpha_text": (
            _lora(
                tmp_path / "alpha.gguf",
                {"output.weight.lora_a": zeros(1, embd), "output.weight.lora_b": zeros(vocab, 1)},
                alpha="one",
            ),
            False,
        ),
    }
    for name, (adapter, fits) in cases.items():
        command = [sys.executable, "-c", _LOADS, str(base), str(adapter), str(free_port())]
        loads = subprocess.run(command, capture_output=True, timeout=120)
        assert (loads.returncode == 0) is fits, f"{name}: llama.cpp {loads.stderr[-400:]!r}"
        try:
            check_fits(read_adapter(adapter), base, "tiny")
        except AdapterRefused as refused:
            assert not fits, f"{name}: refused, but llama.cpp loads it: {refused}"
        else:
            assert fits, f"{name}: accepted, but llama.cpp refuses it"

    # Whole numbers: llama.cpp loads them, then its engine crashes (SIGSEGV) at
    # the first request that applies the adapter. Refused, whatever their shape.
    whole = {
        "output.weight.lora_a": np.zeros((1, embd), np.int32),
        "output.weight.lora_b": np.zeros((vocab, 1), np.int32),
    }
    with pytest.raises(AdapterRefused, match="holds I32 values"):
        read_adapter(_lora(tmp_path / "ints.gguf", whole))


# -- external providers and fallbacks ----------------------------------------------


def publish_external(h: GatewayHarness, url: str, key_file: Path, name: str = "ext") -> None:
    """An external model NAME (the provider's "m" at ``url``), once the gateway serves it."""
    add_external_model(h.store, name, url, "m", key_file)
    h.refresh()
    h.wait_until(lambda: h.routing.ready_count(name) == 1)


@contextlib.contextmanager
def beside_a_provider(
    tmp_path: Path, engines: dict[str, MockBehaviour], **harness: Any
) -> Iterator[tuple[Provider, GatewayHarness, Path]]:
    """A provider (its model "m", its key in a private file) and a gateway."""
    key_file = provider_key(tmp_path, "sk-provider-secret")
    with (
        Provider(key="sk-provider-secret", model="m") as provider,
        GatewayHarness(tmp_path, engines, **harness) as h,
    ):
        yield provider, h, key_file


def provider_key(tmp_path: Path, secret: str) -> Path:
    """A provider's key in a private file, as `model add --key-file` wants it."""
    path = tmp_path / "provider.key"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


def test_stream_options_null_cannot_turn_off_the_usage_a_stream_is_charged(
    tmp_path: Path,
) -> None:
    # A client sending "stream_options": null after the field the gateway adds
    # would have the engine send no usage: the stream charged a guess.
    policies = {"budgeted": {"budget_tokens": 100_000, "budget_period": "day"}}
    keys = {"budgeted": None, "free": None}  # the handler's path and the express lane's
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, keys=keys, policies=policies) as h:
        limiter = h.gateway.limiter
        charged = []
        for extra in ({}, {"stream_options": None}):
            before = limiter.spent("budgeted")
            r = post(h, "budgeted", chat(stream=True) | extra)
            assert r.status_code == 200 and '"usage"' not in r.text  # not asked for: not shown
            h.wait_until(lambda: limiter.spent("budgeted") > before)  # noqa: B023
            charged.append(limiter.spent("budgeted") - before)
            assert post(h, "free", chat(stream=True) | extra).status_code == 200
        assert charged[0] == charged[1]
        sent = [json.loads(b) for b in h.mocks["pg-a"].stats.bodies]
        assert [b["stream_options"] for b in sent] == [{"include_usage": True}] * 4


def test_a_whole_answer_larger_than_the_gateway_keeps_is_refused_not_held(
    tmp_path: Path,
) -> None:
    # 300,000 tokens of "tok ": 1.2 MB whole, past a 1 MiB bound; streamed, it passes.
    keys = {"plain": None, "limited": None}  # the express lane's path and the handler's
    policies = {"limited": {"rpm": 100}}
    with GatewayHarness(
        tmp_path,
        {"pg-a": MockBehaviour(tokens=300_000)},
        keys=keys,
        policies=policies,
        max_answer_bytes=1 << 20,
    ) as h:
        for key in keys:
            # (Streamed first: its engine connection is kept, so "plain" goes
            # through the express lane, which answers on a kept one.)
            streamed = post(h, key, chat(stream=True))
            assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
            r = post(h, key, chat())
            assert r.status_code == 502, (key, r.status_code)
            error = r.json()["error"]
            assert error["code"] == "upstream_error"
            assert "larger than the 1048576 bytes the gateway relays whole" in error["message"]
        assert h.in_loop(lambda: h.routing.replicas(MODEL)[0].in_flight) == 0


def test_a_provider_url_that_cannot_be_sent_falls_back_instead_of_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from letsinfer.authority import external

    # An authority from before such URLs were refused at `model add`.
    monkeypatch.setattr(external, "check_url", lambda url: url)
    with beside_a_provider(tmp_path, {"pg-a": QUICK}, keys={"k": None}) as (provider, h, key):
        publish_external(h, provider.url + "/модель", key)
        ask = chat() | {"model": "ext"}
        r = post(h, "k", ask)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_replica"
        set_fallback(h.store, "ext", MODEL)
        h.refresh()
        r = post(h, "k", ask)
        assert r.status_code == 200 and r.headers["x-letsinfer-fallback"] == MODEL, r.text
        assert provider.seen == []


def test_a_model_without_a_group_that_can_serve_falls_back_with_a_header(
    tmp_path: Path,
) -> None:
    key_file = provider_key(tmp_path, "sk-provider-secret")
    with (
        Provider(key="sk-provider-secret", model="their-model") as provider,
        GatewayHarness(
            tmp_path,
            {"pg-a": QUICK},
            capacity=1,
            keys={"only-mock": None, "alice": None},
            queue_max_wait_s=0.2,
        ) as h,
    ):
        add_external_model(h.store, "ext", provider.url, "their-model", key_file)
        set_fallback(h.store, MODEL, "ext")
        allow(h, "only-mock", MODEL)
        h.wait_until(lambda: h.routing.ready_count("ext") == 1)

        served = post(h, "only-mock", chat())
        assert served.status_code == 200 and "x-letsinfer-fallback" not in served.headers

        # Its only group goes: the provider answers (allowlists apply to the model asked for).
        h.in_loop(lambda: h.routing.withdraw(MODEL, "pg-a", "engine exited"))
        r = post(h, "only-mock", chat())
        assert r.status_code == 200, r.text
        assert r.headers["x-letsinfer-fallback"] == "ext"
        assert r.json()["choices"][0]["message"]["content"] == ANSWER
        seen = provider.seen[-1]
        assert seen.headers["authorization"] == "Bearer sk-provider-secret"
        assert seen.body["model"] == "their-model" and seen.path == "/v1/chat/completions"
        listed = httpx.get(h.url + "/v1/models", headers=h.auth("only-mock")).json()["data"]
        assert [m["id"] for m in listed] == [MODEL], "the fallback is not opened to the key"
        assert post(h, "only-mock", chat() | {"model": "ext"}).status_code == 404

        # Full past the queue's wait falls back too.
        h.publish("pg-a")
        gated(h)

        async def full() -> httpx.Response:
            async with httpx.AsyncClient(timeout=30) as client:
                url = h.url + "/v1/chat/completions"
                hold = asyncio.create_task(client.post(url, json=chat(), headers=h.auth("alice")))
                while h.mocks["pg-a"].stats.in_flight < 1:
                    await asyncio.sleep(0.01)
                late = await client.post(url, json=chat(), headers=h.auth("only-mock"))
                open_gate(h)
                assert (await hold).status_code == 200
                return late

        late = asyncio.run(full())
        assert late.status_code == 200 and late.headers["x-letsinfer-fallback"] == "ext"

        # Without a fallback, the model's own answer stands.
        set_fallback(h.store, MODEL, None)
        h.refresh()
        h.in_loop(lambda: h.routing.withdraw(MODEL, "pg-a", "engine exited"))
        assert post(h, "only-mock", chat()).status_code == 503


def allow(h: GatewayHarness, key: str, model: str) -> None:
    h.store.db.execute("UPDATE api_keys SET models = ? WHERE name = ?", (f'["{model}"]', key))
    h.refresh()


def test_a_provider_key_that_fails_is_a_clean_error_naming_no_secret_or_falls_back(
    tmp_path: Path,
) -> None:
    with beside_a_provider(tmp_path, {"pg-a": QUICK}) as (provider, h, key_file):
        publish_external(h, provider.url, key_file)
        r = post(h, "alice", chat() | {"model": "ext"})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER
        streamed = post(h, "alice", chat(stream=True) | {"model": "ext"})
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        # Answers name the model the client knows, not the provider's.
        events = [json.loads(e[6:]) for e in streamed.text.split("\n\n") if e[6:7] == "{"]
        assert r.json()["model"] == "ext" and {e["model"] for e in events} == {"ext"}
        # A stream that ends cleanly but early is not passed off as a whole answer.
        provider.cut = True
        cut = post(h, "alice", chat(stream=True) | {"model": "ext"})
        assert cut.status_code == 200 and "data: [DONE]" not in cut.text
        last = json.loads(cut.text.strip().split("\n\n")[-1][6:])
        assert last["error"]["code"] == "upstream_stream_error", cut.text
        assert "ended without [DONE]" in last["error"]["message"]
        provider.cut = False

        key_file.write_text("sk-rotated\n")  # read per request: rotation needs no restart
        r = post(h, "alice", chat() | {"model": "ext"})
        assert provider.seen[-1].headers["authorization"] == "Bearer sk-rotated"
        # The provider refused the gateway's key: never told to the client as its own 401.
        assert r.status_code == 502 and r.json()["error"]["code"] == "provider_refused_key"
        key_file.unlink()
        r = post(h, "alice", chat() | {"model": "ext"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "provider_key_unreadable"
        assert "sk-" not in r.text
        key_file.write_bytes(b"\xff\xfe not text\n")  # a rotation gone wrong: no 500 either
        r = post(h, "alice", chat() | {"model": "ext"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "provider_key_unreadable"

        # With a fallback, both are failures before the first byte: it answers.
        set_fallback(h.store, "ext", MODEL)
        h.refresh()
        unreadable = post(h, "alice", chat() | {"model": "ext"})
        assert unreadable.status_code == 200, unreadable.text
        assert unreadable.headers["x-letsinfer-fallback"] == MODEL
        key_file.write_text("sk-rotated\n")  # the provider refuses it
        refused_by_provider = post(h, "alice", chat() | {"model": "ext"})
        assert refused_by_provider.status_code == 200, refused_by_provider.text
        assert refused_by_provider.headers["x-letsinfer-fallback"] == MODEL
        assert h.mocks["pg-a"].stats.requests == 2


def test_a_providers_own_failure_is_relayed_with_its_retry_after_or_falls_back(
    tmp_path: Path,
) -> None:
    with beside_a_provider(tmp_path, {"pg-a": QUICK}) as (provider, h, key_file):
        add_external_model(h.store, "ext", provider.url, "m", key_file)
        # A provider that is down: nothing listens on its port.
        add_external_model(h.store, "down", "http://127.0.0.1:9/v1", "m", key_file)
        h.refresh()
        h.wait_until(lambda: h.routing.ready_count("ext") == h.routing.ready_count("down") == 1)

        # No fallback: the provider's answer is the answer, with when to come back.
        provider.outage = (429, {"retry-after": "7"})
        r = post(h, "alice", chat() | {"model": "ext"})
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        assert r.json()["error"]["code"] == "outage"
        # Brought within 1 s to a day, an HTTP date as the seconds until it, and
        # anything else (or nothing) 5 s: a 429 always says when, and never
        # invites a retry at once.
        soon = email.utils.formatdate(time.time() + 120, usegmt=True)
        for sent, relayed in [
            ("0", "1"),
            ("99999999999999", "86400"),
            ("-5", "5"),
            ("1.5", "5"),
            ("x", "5"),
            (soon, {"119", "120", "121"}),
        ]:
            provider.outage = (429, {"retry-after": sent})
            r = post(h, "alice", chat() | {"model": "ext"})
            got = r.headers.get("retry-after")
            assert r.status_code == 429 and (
                got in relayed if isinstance(relayed, set) else got == relayed
            ), (sent, got)
        provider.outage = (503, {"retry-after": "30"})  # its own: no other replica to try
        calls = len(provider.seen)
        r = post(h, "alice", chat() | {"model": "ext"})
        assert (r.status_code, r.headers.get("retry-after")) == (503, "30"), r.text
        assert r.json()["error"]["code"] == "outage" and len(provider.seen) == calls + 1
        provider.outage = (500, {"retry-after": "soon\xe9"})  # not ASCII: not relayed
        r = post(h, "alice", chat(stream=True) | {"model": "ext"})
        assert r.status_code == 500 and "retry-after" not in r.headers
        r = post(h, "alice", chat() | {"model": "down"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_replica"
        assert "down" in r.json()["error"]["message"] and "127.0.0.1" not in r.text
        # A redirect is never followed (the key would go with it), nor passed on bare.
        provider.outage = (307, {"location": "http://elsewhere.example/v1/chat/completions"})
        r = post(h, "alice", chat() | {"model": "ext"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "provider_failed"
        assert "elsewhere" not in r.text and "location" not in r.headers
        # Nor is a provider's "no such model" or "no such route": it is set up
        # wrong, and the model the client asked for is listed as serving.
        for status in (404, 405, 410):
            provider.outage = (status, {})
            r = post(h, "alice", chat() | {"model": "ext"})
            assert r.status_code == 502 and r.json()["error"]["code"] == "provider_failed"
        # A lone surrogate is valid JSON but has no UTF-8 form: sent escaped, not a 500.
        provider.outage = None
        lone = '{"model":"ext","messages":[{"role":"user","content":"\\ud800"}]}'
        r = httpx.post(h.url + "/v1/chat/completions", content=lone, headers=h.auth("alice"))
        assert r.status_code == 200, r.text
        assert provider.seen[-1].body["messages"][0]["content"] == "\ud800"

        # With a fallback, each is a failure before the first byte: the fallback answers.
        set_fallback(h.store, "ext", MODEL)
        h.refresh()
        for status in (429, 500, 502, 503, 404):
            provider.outage = (status, {})
            for stream in (False, True):
                r = post(h, "alice", chat(stream=stream) | {"model": "ext"})
                assert r.status_code == 200, (status, stream, r.text)
                assert r.headers["x-letsinfer-fallback"] == MODEL
        assert h.mocks["pg-a"].stats.requests == 10

        # The fallback cannot answer either: the error is the model asked for's.
        h.in_loop(lambda: h.routing.withdraw(MODEL, "pg-a", "engine exited"))
        r = post(h, "alice", chat() | {"model": "ext"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "provider_failed"
        assert "'ext'" in r.json()["error"]["message"] and MODEL not in r.text
        provider.outage = None
        assert post(h, "alice", chat() | {"model": "ext"}).status_code == 200


def test_an_external_model_stops_and_starts_like_any_other(tmp_path: Path) -> None:
    from letsinfer.authority.lifecycle import set_model_desired

    with beside_a_provider(tmp_path, {"pg-a": QUICK}) as (provider, h, key_file):
        publish_external(h, provider.url, key_file)
        # A paid provider run away, or a leaked key: the administrator stops it.
        assert set_model_desired(h.store, "ext", "stopped", actor="cli").placement_groups == 1
        h.refresh()
        r = post(h, "alice", chat() | {"model": "ext"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_stopped"
        assert not provider.seen
        set_fallback(h.store, "ext", MODEL)  # as for a local model, its fallback answers
        h.refresh()
        assert post(h, "alice", chat() | {"model": "ext"}).headers["x-letsinfer-fallback"] == MODEL
        set_model_desired(h.store, "ext", "running", actor="cli")
        h.refresh()
        h.wait_until(lambda: h.routing.ready_count("ext") == 1)
        r = post(h, "alice", chat() | {"model": "ext"})
        assert r.status_code == 200 and "x-letsinfer-fallback" not in r.headers
        assert len(provider.seen) == 1
        assert [a.action for a in h.store.list_audit()][-3:] == [
            "model.stop",
            "model.fallback",
            "model.start",
        ]


def test_a_failed_fallback_answers_with_the_model_asked_for(tmp_path: Path) -> None:
    key_file = provider_key(tmp_path, "sk-provider-secret")
    with GatewayHarness(tmp_path, {"pg-a": QUICK}, keys={"only-mock": None}) as h:
        # A provider that is down: nothing listens on its port.
        add_external_model(h.store, "ext", "http://127.0.0.1:9/v1", "m", key_file)
        set_fallback(h.store, MODEL, "ext")
        allow(h, "only-mock", MODEL)
        h.wait_until(lambda: h.routing.ready_count("ext") == 1)
        h.in_loop(lambda: h.routing.withdraw(MODEL, "pg-a", "engine exited"))
        r = post(h, "only-mock", chat())
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "no_healthy_replica" and MODEL in error["message"]
        # Nothing of the fallback the key may not use, nor of where it lives.
        assert "ext" not in r.text and "127.0.0.1:9" not in r.text
        assert "x-letsinfer-fallback" not in r.headers

    # A fallback provider that answers with its own failure: not for this client either.
    with (
        Provider(key="sk-provider-secret", model="m") as provider,
        GatewayHarness(tmp_path / "2", {"pg-a": QUICK}, keys={"only-mock": None}) as h,
    ):
        add_external_model(h.store, "ext", provider.url, "m", key_file)
        set_fallback(h.store, MODEL, "ext")
        allow(h, "only-mock", MODEL)
        h.wait_until(lambda: h.routing.ready_count("ext") == 1)
        h.in_loop(lambda: h.routing.withdraw(MODEL, "pg-a", "engine exited"))
        for status in (429, 500):
            provider.outage = (status, {"retry-after": "7"})
            r = post(h, "only-mock", chat())
            assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_replica"
            assert "outage" not in r.text and r.headers["retry-after"] == "1"
            assert "x-letsinfer-fallback" not in r.headers


def test_an_adapter_has_a_fallback_of_its_own_and_its_errors_name_only_it(
    tmp_path: Path,
) -> None:
    with beside_a_provider(tmp_path, {"pg-a": QUICK}, keys={"tuned-only": None}) as (
        provider,
        h,
        key_file,
    ):
        h.store.add_adapter("tuned", MODEL, "1" * 64, 1, None)
        add_external_model(h.store, "ext", provider.url, "m", key_file)
        set_fallback(h.store, MODEL, "ext")
        allow(h, "tuned-only", "tuned")
        h.in_loop(lambda: h.routing.set_adapters(MODEL, "pg-a", ("tuned",)))
        h.wait_until(lambda: h.routing.ready_count("ext") == 1)
        assert post(h, "tuned-only", chat() | {"model": "tuned"}).status_code == 200

        h.in_loop(lambda: h.routing.withdraw(MODEL, "pg-a", "engine exited"))
        # The base's fallback is not the adapter's: its answer would lack the tuning.
        r = post(h, "tuned-only", chat() | {"model": "tuned"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_replica"
        assert "'tuned'" in r.text and MODEL not in r.text and "pg-a" not in r.text
        assert r.headers["retry-after"] == "1"

        assert set_fallback(h.store, "tuned", "ext").fallback == "ext"
        h.refresh()
        r = post(h, "tuned-only", chat() | {"model": "tuned"})
        assert r.status_code == 200 and r.headers["x-letsinfer-fallback"] == "ext"
        assert provider.seen[-1].body["model"] == "m" and "lora" not in provider.seen[-1].body
        assert [a.fallback for a in h.store.list_adapters()] == ["ext"]
        h.store.delete_service("ext")  # a name reused later must not inherit the traffic
        assert [a.fallback for a in h.store.list_adapters()] == [None]


def test_a_fallback_to_a_removed_adapter_or_model_is_cleared(tmp_path: Path) -> None:
    from letsinfer.store import AuthorityStore

    store = AuthorityStore(tmp_path / "authority.db")
    try:
        store.add_service("base", "0" * 64, 0, "gguf", None)
        store.add_service("other", "1" * 64, 0, "gguf", None)
        store.add_adapter("tuned", "base", "2" * 64, 1, None)
        store.add_adapter("tuned-too", "base", "3" * 64, 1, None)
        set_fallback(store, "other", "tuned")
        store.delete_adapter("tuned")
        # Else whatever took the name next (an external provider...) would get its traffic.
        assert store.get_service("other").fallback is None  # type: ignore[union-attr]
        set_fallback(store, "other", "tuned-too")
        store.delete_service("base")  # its adapters go with it
        assert store.list_adapters() == []
        assert store.get_service("other").fallback is None  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_bad_limit_change_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    from letsinfer.authority.apikeys import set_policy
    from letsinfer.store import AuthorityStore, StoreError

    store = AuthorityStore(tmp_path / "authority.db")
    try:
        create_key(store, "k", policy={"rpm": 10})
        before = store.list_api_keys(name="k")[-1]
        for change, words in (
            ({"budget_tokens": 100}, "needs its period"),
            ({"band": "urgent"}, "band must be one of"),
            ({"rpm": 0}, "at least 1"),
            ({"tpm": "many"}, "whole number"),
            ({"tpm": 10**20}, "at most"),  # more than SQLite holds: no traceback
            ({"budget_period": "week"}, "give the budget too"),  # not dropped in silence
            ({"budget_tokens": None, "budget_period": "day"}, "give the budget too"),
            ({"cache_sampled": True}, "give its TTL too"),
        ):
            with pytest.raises(StoreError, match=words):
                set_policy(store, "k", change)
        with pytest.raises(StoreError, match="no active API key"):
            set_policy(store, "nobody", {"rpm": 5})
        with pytest.raises(StoreError, match="concurrency must be between"):
            create_key(store, "huge", concurrency=10**20)
        for look_alike in ("k²", "ключ"):  # letters and digits, but not ASCII ones
            with pytest.raises(StoreError, match="ASCII letters"):
                create_key(store, look_alike)
        with pytest.raises(StoreError, match="budget_tokens must be at most"):
            create_key(store, "huge", policy={"budget_tokens": 10**20, "budget_period": "day"})
        assert [k.name for k in store.list_api_keys()] == ["k"]
        assert store.list_api_keys(name="k")[-1] == before
        # Each refusal is in the audit chain (a name that is none only in its detail).
        denied = [(r.action, r.target) for r in store.list_audit() if r.outcome == "denied"]
        assert denied == [("auth.key.limits", "k")] * 8 + [
            ("auth.key.limits", "nobody"),
            ("auth.key.create", "huge"),
            ("auth.key.create", None),
            ("auth.key.create", None),
            ("auth.key.create", "huge"),
        ]
        after = set_policy(store, "k", {"rpm": None, "budget_tokens": 9, "budget_period": "week"})
        assert (after.rpm, after.budget_tokens, after.budget_period) == (None, 9, "week")
        cleared = set_policy(store, "k", {"budget_tokens": None})
        assert (cleared.budget_tokens, cleared.budget_period) == (None, None)
        assert [r.action for r in store.list_audit()][-2:] == ["auth.key.limits"] * 2
    finally:
        store.close()


def test_external_models_and_fallbacks_are_checked_before_anything_changes(
    tmp_path: Path,
) -> None:
    from letsinfer.authority import install
    from letsinfer.authority.install import InstallRequest
    from letsinfer.store import AuthorityStore, StoreError

    store = AuthorityStore(tmp_path / "authority.db")
    key = tmp_path / "key"
    key.write_text("sk-x\n")
    key.chmod(0o600)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    accented = tmp_path / "accented"
    accented.write_text("sk-clé\n")  # no HTTP header can carry it as it is
    accented.chmod(0o600)
    try:
        store.add_service("local", "0" * 64, 0, "gguf", None)
        url = "https://api.example.com/v1"
        for args, kwargs, words in (
            (("e", "https://user:pw@api.example.com/v1", "m", key), {}, "no user, query"),
            (("e", "https://api.example.com/v1?api-key=sk-x", "m", key), {}, "no user, query"),
            (("e", "ftp://api.example.com", "m", key), {}, "is not an http"),
            (("e", url, "m", tmp_path / "missing"), {}, "key file"),
            (("e", url, "m", empty), {}, "exactly one line"),
            (("e", url, "m", accented), {}, "visible ASCII"),
            (("e", "http://api.example.com/v1", "m", key), {"ca_file": key}, "CA file"),
            (("e", url, "m", key), {"fallback": "nothing"}, "no such model"),
            (("e", url, "m", key), {"fallback": "e"}, "its own fallback"),
            (("local", url, "m", key), {}, "already exists"),
            (("local\n", url, "m", key), {}, "invalid model name"),  # one log line, one name
        ):
            with pytest.raises(StoreError, match=words):
                add_external_model(store, *args, **kwargs)
        assert [s.name for s in store.list_services()] == ["local"]
        # Each refusal is audited, and changed nothing else.
        assert [(r.action, r.outcome) for r in store.list_audit()] == [("model.add", "denied")] * 11
        with pytest.raises(StoreError, match="its own fallback"):
            set_fallback(store, "local", "local")
        assert store.get_service("local").fallback is None  # type: ignore[union-attr]

        add_external_model(store, "e", url, "m", key)
        placing = InstallRequest("e", ("main",), "cpu", 1, (), "xllamacpp")
        with pytest.raises(StoreError, match="is external"):
            install.plan(store, placing, 20, "main-id")
        assert store.list_placement_groups() == []
    finally:
        store.close()
