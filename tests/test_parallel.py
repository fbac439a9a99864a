"""Parallel runtimes: the plan core hands to vLLM/Ray, and atomic publication."""

from __future__ import annotations

import pytest

from letsinfer.authority.parallel import TaskBoard, TaskReport
from letsinfer.engines.vllm import ParallelLayout, ParallelTask, plan_vllm, vllm_release

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


def test_vllm_multi_node_plan_gives_every_task_its_gpus_and_the_head_address() -> None:
    plans = plan_vllm(
        vllm_release("0.11.0"),
        "/models/m",
        "m",
        "lie-key",
        ParallelLayout(tensor=2, pipeline=2),
        TASKS,
        "ray-secret",
        "/run/x",
    )
    head_ray, serve = plans["0"]
    [worker] = plans["1"]
    assert head_ray.argv[:3] == ["ray", "start", "--head"]
    assert "--node-ip-address=10.0.0.1" in head_ray.argv
    assert serve.argv[:3] == ["vllm", "serve", "/models/m"]
    assert serve.argv[serve.argv.index("--tensor-parallel-size") + 1] == "2"
    assert serve.argv[serve.argv.index("--pipeline-parallel-size") + 1] == "2"
    assert serve.argv[serve.argv.index("--distributed-executor-backend") + 1] == "ray"
    assert "lie-key" not in " ".join(serve.argv)  # the key travels in a 0600 file
    assert serve.env["CUDA_VISIBLE_DEVICES"] == "GPU-a0,GPU-a1"
    assert worker.env["CUDA_VISIBLE_DEVICES"] == "GPU-b0,GPU-b1"
    assert worker.env["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert worker.env["VLLM_HOST_IP"] == "10.0.0.2"
    assert "--address=10.0.0.1:6379" in worker.argv
    assert serve.base_url == "http://10.0.0.1:9000"


def test_vllm_plan_refuses_a_layout_the_gpus_do_not_match() -> None:
    with pytest.raises(ValueError, match="needs 8 GPUs"):
        plan_vllm(vllm_release("0.11.0"), "/m", "m", "k", ParallelLayout(4, 2), TASKS, "t", "/r")
    with pytest.raises(ValueError, match="not parallel"):
        plan_vllm(
            vllm_release("0.11.0"), "/m", "m", "k", ParallelLayout(2, 1), TASKS[:1], "t", "/r"
        )
