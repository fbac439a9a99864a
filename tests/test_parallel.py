"""Parallel runtimes: the plan core hands to vLLM/Ray, and atomic publication."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from letsinfer.authority import install
from letsinfer.authority.parallel import TaskBoard, TaskReport
from letsinfer.authority.placements import desired_for_node
from letsinfer.contracts.placement import from_wire, to_wire
from letsinfer.engines import releases
from letsinfer.engines.launch import EngineTask
from letsinfer.engines.parallel_command import GroupTask, plan_parallel_command
from letsinfer.engines.vllm import (
    NOT_SUPERVISED,
    ParallelLayout,
    ParallelTask,
    plan_vllm,
    vllm_release,
)
from letsinfer.store import AuthorityStore, StoreError

TASKS = [
    ParallelTask("0", "node-a", "10.0.0.1", ("GPU-a0", "GPU-a1"), 9000),
    ParallelTask("1", "node-b", "10.0.0.2", ("GPU-b0", "GPU-b1"), 9100),
]


def test_a_two_task_group_is_published_only_when_both_tasks_are_ready() -> None:
    board = TaskBoard()
    expected = {"0", "1"}
    board.report("pg", "0", TaskReport("node-a", "ready", "http://10.0.0.1:9000"))
    assert board.endpoint("pg", expected) is None
    assert board.waiting_for("pg", expected) == ["1"]
    board.report("pg", "1", TaskReport("node-b", "starting", None))
    assert board.endpoint("pg", expected) is None
    board.report("pg", "1", TaskReport("node-b", "ready", "http://10.0.0.2:9100"))
    assert board.endpoint("pg", expected) == "http://10.0.0.1:9000"
    board.forget_node("node-b")  # its facts went stale
    assert board.endpoint("pg", expected) is None


VLLM_DIGEST = "a" * 64  # the vllm package's digest (engines/package.py)


def test_a_vllm_release_is_bound_to_its_packages_bytes() -> None:
    release = vllm_release("0.34.0", VLLM_DIGEST)
    assert release.artifacts == {"vllm": VLLM_DIGEST}
    # Another build under the same version is another release, never the same id.
    assert vllm_release("0.34.0", "b" * 64).id != release.id
    with pytest.raises(ValueError, match="not a sha256"):
        vllm_release("0.34.0", "")


def test_vllm_multi_node_plan_gives_every_task_its_gpus_and_the_head_address() -> None:
    plans = plan_vllm(
        vllm_release("0.34.0", VLLM_DIGEST),
        "/models/m",
        "m",
        "lie-key",
        ParallelLayout(tensor=2, pipeline=2),
        TASKS,
        "ray-secret",
    )
    head_ray, serve = plans["0"]
    [worker] = plans["1"]
    assert head_ray.argv[:3] == ["ray", "start", "--head"]
    assert "--node-ip-address=10.0.0.1" in head_ray.argv
    assert serve.argv[:3] == ["vllm", "serve", "/models/m"]
    assert serve.argv[serve.argv.index("--tensor-parallel-size") + 1] == "2"
    assert serve.argv[serve.argv.index("--pipeline-parallel-size") + 1] == "2"
    assert serve.argv[serve.argv.index("--distributed-executor-backend") + 1] == "ray"
    # vLLM 0.34 has no --api-key-file: its key is VLLM_API_KEY, never on a command line.
    assert "--api-key-file" not in serve.argv and serve.env["VLLM_API_KEY"] == "lie-key"
    for plan in (head_ray, serve, worker):
        assert "lie-key" not in " ".join(plan.argv) and "ray-secret" not in " ".join(plan.argv)
        # Ray 2.60's token authentication, on every process of the Ray cluster.
        assert (plan.env["RAY_AUTH_MODE"], plan.env["RAY_AUTH_TOKEN"]) == ("token", "ray-secret")
    assert "VLLM_API_KEY" not in head_ray.env and "VLLM_API_KEY" not in worker.env
    assert serve.env["CUDA_VISIBLE_DEVICES"] == "GPU-a0,GPU-a1"
    assert worker.env["CUDA_VISIBLE_DEVICES"] == "GPU-b0,GPU-b1"
    assert worker.env["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert worker.env["VLLM_HOST_IP"] == "10.0.0.2"
    assert "--address=10.0.0.1:6379" in worker.argv
    assert serve.base_url == "http://10.0.0.1:9000"


def test_vllm_plan_refuses_a_layout_the_gpus_do_not_match() -> None:
    with pytest.raises(ValueError, match="needs 8 GPUs"):
        plan_vllm(
            vllm_release("0.34.0", VLLM_DIGEST), "/m", "m", "k", ParallelLayout(4, 2), TASKS, "t"
        )
    with pytest.raises(ValueError, match="not parallel"):
        plan_vllm(
            vllm_release("0.34.0", VLLM_DIGEST),
            "/m",
            "m",
            "k",
            ParallelLayout(2, 1),
            TASKS[:1],
            "t",
        )


# -- core's side: install, desired placements, the parallel-command plan --------


def _cluster_store(tmp_path: Path, targets: list[str], gpus: int) -> AuthorityStore:
    store = AuthorityStore(tmp_path / "authority.db")
    store.add_node("main-id", "main", "main", None)
    for i, name in enumerate(("n1", "n2")):
        store.add_node(f"{name}-id", name, "child", f"10.0.0.{i + 1}:8444")
        store.record_node_facts(
            f"{name}-id",
            {
                "targets": targets,
                "gpus": [{"uuid": f"GPU-{name}-{g}", "name": "H100"} for g in range(gpus)],
            },
        )
    store.add_service("m", "0" * 64, 1, "gguf", None)
    return store


RUNTIMES = install.ParallelRuntimes(vllm_version="0.34.0", parallel_command="/opt/pc")


class _RunnableVllm(install.ParallelRuntimes):
    """The cuda planning as it will be once agents run vLLM groups."""

    def release_for(self, target: str) -> releases.Release:
        return (
            vllm_release(self.vllm_version, VLLM_DIGEST)
            if target == "cuda"
            else super().release_for(target)
        )


RUNNABLE_VLLM = _RunnableVllm(vllm_version="0.34.0", parallel_command="/opt/pc")


def _req(*nodes: str, **kw: object) -> install.InstallRequest:
    return install.InstallRequest(service="m", nodes=nodes, parallel=True, **kw)  # type: ignore[arg-type]


def test_install_makes_one_group_with_a_task_per_node_and_its_own_gpus(tmp_path: Path) -> None:
    store = _cluster_store(tmp_path, ["cpu", "cuda"], gpus=2)
    plan = install.plan_parallel(store, _req("n1", "n2", gpus=2), RUNNABLE_VLLM, 60)
    assert plan.release.engine == "vllm"
    assert [(n.name, t.task, t.address, t.port, t.gpu_uuids) for n, t in plan.tasks] == [
        ("n1", "0", "10.0.0.1", 20000, ("GPU-n1-0", "GPU-n1-1")),
        ("n2", "1", "10.0.0.2", 20000, ("GPU-n2-0", "GPU-n2-1")),
    ]
    pg_id = install.apply_parallel(store, plan, lambda r: "sig")
    assert store.pg_gpus(pg_id) == ["GPU-n1-0", "GPU-n1-1", "GPU-n2-0", "GPU-n2-1"]
    store.add_service("m2", "1" * 64, 1, "gguf", None)
    with pytest.raises(StoreError, match="n1 needs 1 free GPU"):
        install.plan_parallel(
            store, install.InstallRequest("m2", ("n1", "n2"), parallel=True), RUNNABLE_VLLM, 60
        )

    # Each node is told only its own task, the whole group, and the group key.
    secret = b"s" * 32
    [head] = desired_for_node(store, "n1-id", secret)
    [worker] = desired_for_node(store, "n2-id", secret)
    assert (head.task, head.port, worker.task, worker.port) == ("0", 20000, "1", 20000)
    assert worker.gpu_uuids == ("GPU-n2-0", "GPU-n2-1")
    assert [p.node_id for p in worker.peers] == ["n1-id"]
    assert head.group_key == worker.group_key and head.engine_key != worker.engine_key
    assert from_wire(to_wire(worker), 1, 256, 1).group == worker.group
    store.close()


def test_install_refuses_what_it_cannot_run_as_one_atomic_group(tmp_path: Path) -> None:
    store = _cluster_store(tmp_path, ["cpu"], gpus=0)
    single = install.InstallRequest(
        "m", ("n1", "n2"), parallel=True, engine="xllamacpp", engine_explicit=True
    )
    with pytest.raises(StoreError, match="single-device runtime: core never splits it"):
        install.plan_parallel(store, single, RUNTIMES, 60)
    with pytest.raises(StoreError, match="two or more distinct nodes"):
        install.plan_parallel(store, _req("n1", "n1"), RUNTIMES, 60)
    with pytest.raises(StoreError, match="no parallel runtime for cpu targets"):
        install.plan_parallel(
            store, _req("n1", "n2"), install.ParallelRuntimes(vllm_version="0.34.0"), 60
        )
    with pytest.raises(StoreError, match="main's own agent does not prove data links"):
        install.plan_parallel(store, _req("main", "n1"), RUNTIMES, 60)
    plan = install.plan_parallel(store, _req("n1", "n2"), RUNTIMES, 60)
    assert plan.release.engine == "parallel-command" and plan.release.target == "cpu"
    assert store.list_placement_groups() == []
    store.close()


def test_install_refuses_a_vllm_group_no_agent_can_run_and_stores_nothing(
    tmp_path: Path,
) -> None:
    store = _cluster_store(tmp_path, ["cpu", "cuda"], gpus=2)
    with pytest.raises(StoreError) as refused:
        install.plan_parallel(store, _req("n1", "n2", gpus=2), RUNTIMES, 60)
    assert NOT_SUPERVISED in str(refused.value)
    assert "install without --parallel" in str(refused.value)
    assert store.list_placement_groups() == []
    # On cpu targets the configured parallel-command runtime still takes it.
    plan = install.plan_parallel(store, _req("n1", "n2", target="cpu"), RUNTIMES, 60)
    assert plan.release.engine == "parallel-command"
    store.close()


def test_the_parallel_command_plan_keeps_secrets_off_the_command_line() -> None:
    group = (
        GroupTask("0", "a", "10.0.0.1", 20000, "10.0.0.1:8444"),
        GroupTask("1", "b", "10.0.0.2", 20001, "10.0.0.2:8444"),
    )
    release = releases.parallel_command("/opt/pc")
    for task_id, host, port in (("0", "10.0.0.1", 20000), ("1", "10.0.0.2", 20001)):
        task = EngineTask(
            "pg", "m", Path("/models/m"), host, port, f"engine-key-{task_id}", ("GPU-1",)
        )
        plan = plan_parallel_command(release, task, task_id, group, "group-secret")
        assert "group-secret" not in plan.argv and f"engine-key-{task_id}" not in plan.argv
        assert plan.env["LETSINFER_GROUP_KEY"] == "group-secret"
        assert plan.env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
        assert json.loads(plan.env["LETSINFER_TASKS"])[0] == {
            "task": "0",
            "address": "10.0.0.1",
            "port": 20000,
        }
        assert plan.base_url == f"http://{host}:{port}"
        assert ("LETSINFER_ENGINE_KEY" in plan.env) == (task_id == "0")
