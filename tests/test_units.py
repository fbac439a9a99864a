"""Plain-data pieces, tested without servers."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import pytest

from letsinfer.audit.chain import verify_chain
from letsinfer.engines.binary import BinaryIdentity
from letsinfer.engines.launch import ENGINE_KEY_ENV, EngineTask, plan_llamacpp
from letsinfer.engines.releases import llama_server, xllamacpp_cpu
from letsinfer.engines.tinymodel import write_tiny_model
from letsinfer.gateway import policy, protocol
from letsinfer.gateway.directory import Directory, StoreUnavailable
from letsinfer.gateway.errors import GatewayError
from letsinfer.gateway.routing import Replica, RoutingTable
from letsinfer.store import AuthorityStore, StoreError
from letsinfer.store.migrations import MIGRATIONS


def task(**kw: object) -> EngineTask:
    base = dict(
        pg_id="pg-1",
        model_name="m",
        model_path=Path("/models/m.gguf"),
        host="127.0.0.1",
        port=9001,
        engine_key="lie-secret",
    )
    return EngineTask(**{**base, **kw})  # type: ignore[arg-type]


def test_llama_server_plan_pins_gpus_and_keeps_the_key_off_the_command_line(
    tmp_path: Path,
) -> None:
    plan = plan_llamacpp(
        llama_server(BinaryIdentity("/opt/llama/llama-server", "a" * 64, "version: 1"), "cuda"),
        task(gpu_uuids=("GPU-a", "GPU-b"), parallel=2, context=1024),
        tmp_path,
    )
    assert plan.argv[0] == "/opt/llama/llama-server"
    assert "lie-secret" not in " ".join(plan.argv)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    key_file = Path(plan.argv[plan.argv.index("--api-key-file") + 1])
    assert plan.files[key_file].strip() == "lie-secret"
    assert plan.argv[plan.argv.index("--ctx-size") + 1] == "2048"
    assert plan.argv[plan.argv.index("--parallel") + 1] == "2"
    assert "--n-gpu-layers" in plan.argv and "--embeddings" in plan.argv
    assert plan.health_url == "http://127.0.0.1:9001/health"


def test_bundled_engine_plan_hides_gpus_from_cpu_groups(tmp_path: Path) -> None:
    plan = plan_llamacpp(xllamacpp_cpu(), task(), tmp_path)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.env[ENGINE_KEY_ENV] == "lie-secret"
    assert "lie-secret" not in " ".join(plan.argv)
    spec = json.loads(plan.argv[-1])
    assert spec["alias"] == "m" and spec["port"] == 9001


def replica(pg: str, in_flight: int = 0, capacity: int = 4, paused: bool = False) -> Replica:
    return Replica(
        pg, "m", f"http://{pg}", "Bearer k", capacity, paused=paused, in_flight=in_flight
    )


def pick(table: RoutingTable, exclude: frozenset[str] = frozenset()) -> Replica | None:
    return policy.choose(
        table.replicas("m"), time.monotonic(), policy.RoutingPolicy(), exclude=exclude
    )


def test_routing_prefers_the_least_pressed_ready_replica() -> None:
    table = RoutingTable()
    for r in (replica("a", 3), replica("b", 1), replica("c", 0, paused=True)):
        table.publish(r)
    assert pick(table).pg_id == "b"  # type: ignore[union-attr]
    assert pick(table, exclude=frozenset({"b"})).pg_id == "a"  # type: ignore[union-attr]
    assert pick(table, exclude=frozenset({"a", "b"})) is None  # paused never chosen
    table.withdraw("m", "a", "engine exited")
    table.withdraw("m", "b", "engine exited")
    assert pick(table) is None
    assert "engine exited" in table.explain("m")
    assert table.explain("other") == "no placement group is running it"


def test_republishing_keeps_in_flight_counts() -> None:
    table = RoutingTable()
    table.publish(replica("a", 2))
    table.publish(replica("a", 0))
    assert table.replicas("m")[0].in_flight == 2


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', "messages.0.role"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
        (b'{"model": 7, "messages": [{"role": "user"}]}', "model"),
    ],
)
def test_protocol_names_the_bad_field(body: bytes, param: str) -> None:
    with pytest.raises(GatewayError) as err:
        protocol.parse(body, protocol.CHAT)
    assert err.value.status == 400
    assert err.value.param == param


def test_a_503_says_why_no_replica_takes_requests() -> None:
    table = RoutingTable()
    assert table.explain("m") == "no placement group is running it"
    for pg, node in (("pg-1", "n1"), ("pg-2", "n2")):
        table.publish(Replica(pg, "m", "http://x", "Bearer k", 2, node_id=node))
    table.set_paused_nodes({"n1", "n2"})
    assert "on a node an administrator paused" in table.explain("m")
    assert "`letsinfer node resume`" in table.explain("m")
    table.set_paused_nodes({"n1"})
    table.drain({"pg-2"})
    assert table.explain("m") == "every replica is paused or its facts are stale"
    table.set_paused_nodes(set())
    table.drain({"pg-1"})
    assert table.explain("m") == "every replica is draining for a restart or an upgrade"


def test_refusal_lines_are_held_to_a_rate_and_write_no_field_of_the_client_s(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from letsinfer.gateway import access_log

    caplog.set_level(logging.INFO, "letsinfer.access")
    monkeypatch.setattr(access_log, "_clock", lambda: 1000.0)  # one second
    monkeypatch.setattr(access_log, "_window", [0.0, 0, 0])  # none left out before
    forged = "/v1/models/x status=200 key=admin\n" + "A" * 60000
    for i in range(access_log.MAX_REFUSAL_LINES_PER_S + 30):
        access_log.refusal(f"r{i}", 401, forged)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == access_log.MAX_REFUSAL_LINES_PER_S
    path = lines[0].split(" path=", 1)[1]
    assert " " not in path and "\n" not in path and "status=200" not in lines[0].split("path=")[0]
    assert path.startswith("/v1/models/x%20status=200%20key=admin%0AAAAA")  # one field
    assert len(lines[0]) < 500 and path.endswith("...")
    # A model name is client text too: as it is when plain, else quoted and cut.
    assert access_log.loggable("org/tiny-v2") == "org/tiny-v2"
    odd = access_log.loggable("tiny status=200 " + "x" * 5000)
    assert odd.startswith("tiny%20status=200%20x") and odd.endswith("...") and len(odd) < 300
    monkeypatch.setattr(access_log, "_clock", lambda: 1001.0)  # the next second
    access_log.refusal("later", 401, "/v1/models")
    assert caplog.records[-1].getMessage().endswith("path=/v1/models refusals_not_logged=30")


def test_protocol_passes_unknown_fields_through() -> None:
    parsed = protocol.parse(b'{"model": "m", "prompt": "x", "mirostat": 2}', protocol.COMPLETION)
    assert parsed == {"model": "m", "prompt": "x", "mirostat": 2}


def test_store_migrates_once_and_enforces_gpu_ownership(tmp_path: Path) -> None:
    store = AuthorityStore(tmp_path / "a.db")
    assert store.schema_version() == len(MIGRATIONS)
    store.add_node("n1", "n1", "main", None)
    with pytest.raises(StoreError):
        store.add_node("n2", "n2", "main", None)  # exactly one main, by schema
    store.ensure_release("r1", "llama-server", "1", "cuda", {}, {})
    store.add_service("m", "d" * 64, 1, "gguf", None)
    store.add_placement_group("pg-a", "m", "n1", "r1", "cuda", ("GPU-1",))
    with pytest.raises(StoreError, match="GPU-1"):
        store.add_placement_group("pg-b", "m", "n1", "r1", "cuda", ("GPU-2", "GPU-1"))
    assert [pg.id for pg in store.list_placement_groups()] == ["pg-a"]  # nothing half-added
    store.close()
    reopened = AuthorityStore(tmp_path / "a.db")
    assert reopened.schema_version() == len(MIGRATIONS)
    assert reopened.get_service("m") is not None


def test_audit_chain_detects_reordering(tmp_path: Path) -> None:
    store = AuthorityStore(tmp_path / "a.db")
    for action in ("a", "b", "c"):
        store.append_audit("t", action, "ok")
    records = store.list_audit()
    assert verify_chain(records) is None
    swapped = [records[0], records[2], records[1]]
    broken = verify_chain(swapped)
    assert broken is not None and broken.seq == 3


def test_directory_reports_an_unreadable_store_instead_of_denying(tmp_path: Path) -> None:
    store = AuthorityStore(tmp_path / "a.db")
    directory = Directory(store, max_stale_s=0.0)
    directory.refresh()
    store.close()  # the store goes away
    directory.refresh()
    assert directory.failing
    with pytest.raises(StoreUnavailable):
        directory.key_for("li-anything")


def test_tiny_model_is_byte_for_byte_reproducible(tmp_path: Path) -> None:
    a = write_tiny_model(tmp_path / "a.gguf").read_bytes()
    b = write_tiny_model(tmp_path / "b.gguf").read_bytes()
    assert a[:4] == b"GGUF"
    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    assert 100_000 < len(a) < 2_000_000


def test_republishing_a_replica_keeps_the_object_requests_hold() -> None:
    table = RoutingTable()
    first = replica("a", 0)
    table.publish(first)
    first.in_flight += 1  # a request takes a slot on the published object
    table.publish(replica("a", 0, capacity=8))  # fresh facts arrive meanwhile
    first.in_flight -= 1  # the request gives its slot back to the object it holds
    [current] = table.replicas("m")
    assert current.in_flight == 0 and current.capacity == 8


def test_the_authority_database_is_not_world_readable(tmp_path: Path) -> None:
    store = AuthorityStore(tmp_path / "a.db")
    store.append_audit("t", "x", "ok")
    for name in ("a.db", "a.db-wal"):
        assert (tmp_path / name).stat().st_mode & 0o007 == 0, name
    store.close()


def test_only_a_transient_gap_asks_clients_to_retry(tmp_path: Path) -> None:
    """Which 503 a request gets, from what should run (the directory) and what
    is ready or parked (the routing table)."""
    from letsinfer.authority import lifecycle
    from letsinfer.gateway.availability import Availability

    store = AuthorityStore(tmp_path / "a.db")
    store.add_node("n", "n", "main", None)
    store.ensure_release("r", "xllamacpp", "1", "cpu", {}, {})
    store.add_service("m", "0" * 64, 1, "gguf", None)
    store.add_service("idle", "1" * 64, 1, "gguf", None)
    for pg in ("a", "b"):
        store.add_placement_group(pg, "m", "n", "r", "cpu")
    directory, table = Directory(store), RoutingTable()
    seen = Availability(directory, table)

    def code(service: str = "m") -> tuple[str | None, str | None]:
        directory.refresh(force=True)
        err = seen.refusal(service, "")
        return err.code, err.headers.get("retry-after")

    assert code("idle") == ("model_not_placed", None)
    table.withdraw("m", "a", "engine exited")
    table.park("m", "b", "2 failed starts; last: unknown model architecture")
    assert code() == ("no_healthy_replica", "1"), "a may come back by itself"
    table.park("m", "a", "2 failed starts")
    assert code() == ("model_parked", None)
    assert "unknown model architecture" in seen.refusal("m", "").message
    table.publish(replica("a"))  # unparked and ready again
    assert seen.state("m") == "serving" and not table.parked("m").keys() & {"a"}
    lifecycle.set_model_desired(store, "m", "stopped", actor="t")
    table.forget("m", "a")
    assert code() == ("model_stopped", None)
    state = lifecycle.begin_cluster_stop(store, actor="t")
    lifecycle.complete_cluster_stop(store, state)
    assert code() == ("system_stopped", None)
    with pytest.raises(lifecycle.Refused, match="cluster is stopped"):
        lifecycle.set_model_desired(store, "m", "running", actor="t")
    store.close()


def test_draining_admits_nothing_new_and_survives_fresh_facts() -> None:
    table = RoutingTable()
    table.publish(replica("a"))
    table.publish(replica("b"))
    table.drain({"a"})
    table.publish(replica("a", capacity=8))  # facts keep arriving while it drains
    assert {r.pg_id for r in table.replicas("m") if not r.paused} == {"b"}
    assert pick(table) is not None and pick(table).pg_id == "b"  # type: ignore[union-attr]
    table.undrain({"a"})
    assert table.ready_count("m") == 2


class _Launches:
    """A supervisor that records each launch plan instead of starting an engine."""

    def __init__(self) -> None:
        self.runners: dict[str, object] = {}
        self.plans: list[object] = []

    def ensure(self, identity: object, make_plan: object, port: object) -> None:
        self.plans.append(make_plan(20000))  # type: ignore[operator]
        self.runners[identity.pg_id] = type("Running", (), {"planned": True})()  # type: ignore[attr-defined]

    async def stop(self, pg_id: str) -> None:
        self.runners.pop(pg_id, None)

    async def stop_all(self) -> None:
        self.runners.clear()


def _signed_runner(tmp_path: Path, release: object) -> tuple[object, object, str, list[str]]:
    """A PlacementRunner trusting a key that signed ``release``: (runner,
    supervisor, signature, refusals)."""
    from letsinfer.agent.placement import PlacementRunner
    from letsinfer.home import Home
    from letsinfer.release import runtime

    home = Home.under(tmp_path / "main")
    trusted = runtime.ensure_cluster_key(home)
    refused: list[str] = []
    supervisor = _Launches()
    runner = PlacementRunner(
        tmp_path / "models",
        tmp_path / "run",
        supervisor,  # type: ignore[arg-type]
        "127.0.0.1",
        lambda pg, why: refused.append(why),
        trusted=[trusted],
    )
    return runner, supervisor, runtime.sign(home, release), refused  # type: ignore[arg-type]


def _stored(models: Path, data: bytes) -> str:
    from letsinfer.contracts.artifacts import artifact_path

    digest = hashlib.sha256(data).hexdigest()
    path = artifact_path(models, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def test_a_file_rewritten_on_a_nodes_disk_is_refused_at_its_next_start(tmp_path: Path) -> None:
    import asyncio

    from letsinfer.contracts.artifacts import artifact_path
    from letsinfer.contracts.placement import DesiredPlacement

    release = xllamacpp_cpu()
    runner, supervisor, signature, refused = _signed_runner(tmp_path, release)
    models = tmp_path / "models"
    model, lora = _stored(models, b"model"), _stored(models, b"adapter")

    def desired(generation: int) -> DesiredPlacement:
        return DesiredPlacement(
            "pg-a", "m", model, release, "k", release_signature=signature,
            generation=generation, adapters=(("tuned", lora),),
        )  # fmt: skip

    async def scenario() -> None:
        runner.apply([desired(1)])  # type: ignore[attr-defined]
        await asyncio.gather(*runner._background)  # type: ignore[attr-defined]
        assert len(supervisor.plans) == 1 and refused == []
        artifact_path(models, lora).write_bytes(b"rewritten by someone on this node")
        runner.apply([desired(2)])  # type: ignore[attr-defined]  # a restart: reload, new release
        await asyncio.gather(*runner._background)  # type: ignore[attr-defined]
        assert len(supervisor.plans) == 1, "launched with a file that is not its digest"
        assert refused and lora in refused[-1]

    asyncio.run(scenario())


def test_a_restart_under_way_when_the_node_stops_starts_no_engine(tmp_path: Path) -> None:
    """Ctrl-C while a group restarts for a new generation: its old engine stops,
    and no new one starts once the node has stopped its engines (that one would
    run on after the node, serving nobody)."""
    import asyncio

    from letsinfer.contracts.placement import DesiredPlacement

    release = xllamacpp_cpu()
    runner, supervisor, signature, _ = _signed_runner(tmp_path, release)
    model = _stored(tmp_path / "models", b"model")

    def desired(generation: int) -> DesiredPlacement:
        return DesiredPlacement(
            "pg-a", "m", model, release, "k", release_signature=signature, generation=generation
        )

    async def scenario() -> None:
        engine_stopping = asyncio.Event()

        async def slow_stop(pg_id: str) -> None:  # an engine takes a while to stop
            await engine_stopping.wait()
            supervisor.runners.pop(pg_id, None)  # type: ignore[attr-defined]

        supervisor.stop = slow_stop  # type: ignore[attr-defined]
        runner.apply([desired(1)])  # type: ignore[attr-defined]
        runner.apply([desired(2)])  # type: ignore[attr-defined]  # the restart begins
        await asyncio.sleep(0)
        node_stopping = asyncio.create_task(runner.close())  # type: ignore[attr-defined]
        await asyncio.sleep(0)
        engine_stopping.set()
        await node_stopping
        assert len(supervisor.plans) == 1, "an engine was launched after the node stopped"  # type: ignore[attr-defined]
        assert supervisor.runners == {}  # type: ignore[attr-defined]
        runner.apply([desired(3)])  # type: ignore[attr-defined]  # a late report changes nothing
        assert len(supervisor.plans) == 1  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_node_ends_without_waiting_for_a_download_its_main_stalled(tmp_path: Path) -> None:
    """Ctrl-C on a child fetching a model from a main that stopped sending: the
    node ends now (waiting would leave it to systemd's kill), starting nothing."""
    import asyncio

    from letsinfer.contracts.placement import DesiredPlacement

    release = xllamacpp_cpu()
    runner, supervisor, signature, _ = _signed_runner(tmp_path, release)
    placement = DesiredPlacement("pg-a", "m", "a" * 64, release, "k", release_signature=signature)

    async def scenario() -> None:
        fetching = asyncio.Event()

        async def stalled(digest: str) -> None:
            fetching.set()
            await asyncio.Event().wait()  # the main sends nothing more

        runner.apply([placement], fetch=stalled)  # type: ignore[attr-defined]
        await fetching.wait()
        await asyncio.wait_for(runner.close(), timeout=10)  # type: ignore[attr-defined]
        assert supervisor.plans == []  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_node_the_main_removed_then_took_back_runs_its_engines_again(tmp_path: Path) -> None:
    """Removal stops a node's engines (the main routes to them no more), but the
    agent runs on: when the main accepts its facts again, its groups start."""
    import asyncio

    from letsinfer.contracts.placement import DesiredPlacement

    release = xllamacpp_cpu()
    runner, supervisor, signature, _ = _signed_runner(tmp_path, release)
    model = _stored(tmp_path / "models", b"model")
    placement = DesiredPlacement("pg-a", "m", model, release, "k", release_signature=signature)

    async def scenario() -> None:
        runner.apply([placement])  # type: ignore[attr-defined]
        runner.apply([])  # type: ignore[attr-defined]  # removed
        await runner.stop_all()  # type: ignore[attr-defined]
        runner.apply([placement])  # type: ignore[attr-defined]  # taken back
        assert len(supervisor.plans) == 2 and "pg-a" in supervisor.runners  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_ending_a_nodes_loops_logs_one_that_had_failed_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node's teardown ends its loops before it stops its engines: a loop that
    had died of an error is logged with its traceback, and the teardown goes
    on (awaiting that task re-raised its error, and the engines never stopped)."""
    import asyncio

    from letsinfer.agent.runtime import end_tasks

    async def scenario() -> None:
        async def fails() -> None:
            raise OSError("database or disk is full")

        failed = asyncio.create_task(fails(), name="reconcile loop")
        running = asyncio.create_task(asyncio.sleep(3600), name="identity watch")
        await asyncio.sleep(0)
        await end_tasks([failed, None, running])  # returns: it does not raise
        assert running.cancelled()

    asyncio.run(scenario())
    assert "reconcile loop had failed" in caplog.text
    assert "OSError: database or disk is full" in caplog.text


def test_a_parallel_command_group_claims_no_adapter_it_cannot_load(tmp_path: Path) -> None:
    from letsinfer.contracts.placement import DesiredPlacement
    from letsinfer.engines.parallel_command import GroupTask
    from letsinfer.engines.releases import parallel_command

    release = parallel_command("/opt/llama-rpc-launcher")
    runner, supervisor, signature, refused = _signed_runner(tmp_path, release)
    models = tmp_path / "models"
    model, lora = _stored(models, b"model"), _stored(models, b"adapter")
    group = (
        GroupTask("0", "n1", "10.0.0.1", 20000, "10.0.0.1:8444"),
        GroupTask("1", "n2", "10.0.0.2", 20000, "10.0.0.2:8444"),
    )
    runner.apply(  # type: ignore[attr-defined]
        [
            DesiredPlacement(
                "pg-p", "big", model, release, "k", release_signature=signature, task="0",
                port=20000, group=group, group_key="g", adapters=(("big-tuned", lora),),
            )
        ]
    )  # fmt: skip
    assert len(supervisor.plans) == 1 and refused == []
    plan = supervisor.plans[0]
    assert not any(lora in part for part in [*plan.argv, *plan.env.values()])  # type: ignore[attr-defined]
    # Its launcher loads none: its facts claim none, so no adapter request reaches it.
    assert runner.adapter_names("pg-p") == ()  # type: ignore[attr-defined]


def test_only_partial_imports_of_dead_processes_are_cleaned(tmp_path: Path) -> None:
    import os

    from letsinfer.authority.modelstore import clean_partials

    store = tmp_path / "sha256"
    store.mkdir()
    dead = store / ".import-999999999-big.gguf.part"
    alive = store / f".import-{os.getpid()}-big.gguf.part"
    model = store / f"{'a' * 64}.gguf"
    for path in (dead, alive, model):
        path.write_bytes(b"GGUF")
    # the trial engine's folders beside them (`model add`'s proof at the door)
    dead_trial = store / ".import-999999999-door-x1.part"
    alive_trial = store / f".import-{os.getpid()}-door-x2.part"
    for folder in (dead_trial, alive_trial):
        folder.mkdir()
        (folder / "door.key").write_text("k")
    assert sorted(clean_partials(tmp_path)) == sorted([dead, dead_trial])
    assert not dead.exists() and not dead_trial.exists()
    assert alive.exists() and alive_trial.exists() and model.exists()


def test_an_engine_whose_adapters_changed_while_its_node_was_away_starts_afresh(
    tmp_path: Path,
) -> None:
    """`adapter remove X` then `adapter add X` (another file) restarts the groups
    it can reach; one on a node that was unreachable keeps the old file loaded
    under the same name until its agent sees the adapters differ."""
    import asyncio

    from letsinfer.agent.placement import PlacementRunner
    from letsinfer.contracts.placement import DesiredPlacement

    stopped: list[str] = []

    class Running:
        planned = True

    class Supervisor:
        def __init__(self) -> None:
            self.runners = {"pg-a": Running()}

        async def stop(self, pg_id: str) -> None:
            stopped.append(pg_id)
            self.runners.pop(pg_id, None)

    placements = PlacementRunner(
        tmp_path / "models",
        tmp_path / "run",
        Supervisor(),  # type: ignore[arg-type]
        "127.0.0.1",
        lambda pg, why: None,
    )
    placements.generations["pg-a"] = 3
    placements.adapters["pg-a"] = (("tuned", "1" * 64),)

    def desired(adapter_digest: str) -> DesiredPlacement:
        return DesiredPlacement(
            "pg-a",
            "m",
            "0" * 64,
            xllamacpp_cpu(),
            "k",
            generation=3,
            adapters=(("tuned", adapter_digest),),
        )

    async def scenario() -> None:
        placements.apply([desired("1" * 64)])  # what it loaded: it runs on
        await asyncio.gather(*placements._background)
        assert stopped == []
        placements.apply([desired("2" * 64)])  # same name and generation, another file
        await asyncio.gather(*placements._background)
        assert stopped == ["pg-a"]

    asyncio.run(scenario())
