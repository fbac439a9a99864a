"""vLLM launch plans, including multi-node tensor/pipeline parallelism over Ray.

vLLM is a CUDA runtime: nothing here runs it on a CPU machine, but the plan —
the exact command lines and environments of every task — is real and tested.
Core hands a parallel placement group generic tasks (node, GPU UUIDs, ports,
addresses, credentials); the runtime does the parallelism. Task "0" is the Ray
head and serves the OpenAI API; the others join the head as Ray workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from letsinfer.engines.launch import LaunchPlan
from letsinfer.engines.releases import Release


@dataclass(frozen=True)
class ParallelTask:
    task: str  # "0" is the head
    node_id: str
    address: str  # the node's data address
    gpu_uuids: tuple[str, ...]
    port: int  # the API port (head) or Ray node-manager port (workers)


@dataclass(frozen=True)
class ParallelLayout:
    tensor: int
    pipeline: int

    @property
    def world(self) -> int:
        return self.tensor * self.pipeline


RAY_PORT = 6379


def vllm_release(version: str, executable: str = "vllm", ray: str = "ray") -> Release:
    return Release(
        id=f"vllm-{version}-cuda",
        engine="vllm",
        version=version,
        target="cuda",
        launch={"vllm": executable, "ray": ray},
    )


def _env(task: ParallelTask, head: ParallelTask) -> dict[str, str]:
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(task.gpu_uuids),
        # Ray and NCCL must use the proven data link, not whatever route is default.
        "VLLM_HOST_IP": task.address,
        "RAY_ADDRESS": f"{head.address}:{RAY_PORT}",
        "NCCL_SOCKET_FAMILY": "AF_INET",
    }


def plan_vllm(
    release: Release,
    model_path: str,
    served_name: str,
    engine_key: str,
    layout: ParallelLayout,
    tasks: list[ParallelTask],
    ray_token: str,
    run_dir: str,
) -> dict[str, list[LaunchPlan]]:
    """Per task, the commands to run in order (Ray first, then vLLM on the head)."""
    if not tasks or tasks[0].task != "0":
        raise ValueError("a parallel placement group needs task 0 (the head) first")
    gpus = sum(len(t.gpu_uuids) for t in tasks)
    if gpus != layout.world:
        raise ValueError(
            f"tensor {layout.tensor} x pipeline {layout.pipeline} needs "
            f"{layout.world} GPUs; the tasks hold {gpus}"
        )
    if len(tasks) == 1 and layout.pipeline == 1:
        raise ValueError("a single-task, single-stage layout is not parallel: use one task")
    head = tasks[0]
    ray, vllm = release.launch["ray"], release.launch["vllm"]
    key_file = f"{run_dir}/{served_name}.key"
    plans: dict[str, list[LaunchPlan]] = {}
    base_url = f"http://{head.address}:{head.port}"
    ray_head = LaunchPlan(
        argv=[
            ray,
            "start",
            "--head",
            "--block",
            f"--node-ip-address={head.address}",
            f"--port={RAY_PORT}",
            f"--num-gpus={len(head.gpu_uuids)}",
            "--disable-usage-stats",
        ],
        env={**_env(head, head), "RAY_CLUSTER_TOKEN": ray_token},
        base_url=base_url,
    )
    serve = LaunchPlan(
        argv=[
            vllm,
            "serve",
            model_path,
            "--served-model-name",
            served_name,
            "--host",
            head.address,
            "--port",
            str(head.port),
            "--tensor-parallel-size",
            str(layout.tensor),
            "--pipeline-parallel-size",
            str(layout.pipeline),
            "--distributed-executor-backend",
            "ray" if len(tasks) > 1 else "mp",
            "--api-key-file",
            key_file,
        ],
        env=_env(head, head),
        base_url=base_url,
        files={Path(key_file): engine_key + "\n"},
    )
    plans["0"] = [ray_head, serve] if len(tasks) > 1 else [serve]
    for t in tasks[1:]:
        plans[t.task] = [
            LaunchPlan(
                argv=[
                    ray,
                    "start",
                    "--block",
                    f"--address={head.address}:{RAY_PORT}",
                    f"--node-ip-address={t.address}",
                    f"--num-gpus={len(t.gpu_uuids)}",
                    f"--node-manager-port={t.port}",
                    "--disable-usage-stats",
                ],
                env={**_env(t, head), "RAY_CLUSTER_TOKEN": ray_token},
                base_url=f"http://{t.address}:{t.port}",
            )
        ]
    return plans
