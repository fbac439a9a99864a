"""vLLM launch plans, including multi-node tensor/pipeline parallelism over Ray.

vLLM is a CUDA runtime: nothing here runs it on a CPU machine, but the plan —
the exact command lines and environments of every task — is real and tested.
Core hands a parallel placement group generic tasks (node, GPU UUIDs, ports,
addresses, credentials); the runtime does the parallelism. Task "0" is the Ray
head and serves the OpenAI API; the others join the head as Ray workers.

The flags are those of vLLM 0.34.0 (``[engine] vllm_version``) and Ray 2.60, read from their
wheels' argument parsers (see docs/architecture.md, "vLLM": what was and was
not verified without a GPU). vLLM has no ``--api-key-file``: its key comes from
``VLLM_API_KEY`` in the environment, never the command line. Ray's token
authentication reads ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN``; every Ray
process and ``vllm serve`` (a Ray client) carries both.
"""

from __future__ import annotations

from dataclasses import dataclass

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

# Agents run one process per task; a vLLM task is several (the Ray head and
# `vllm serve`), so no agent runs one yet. Install says so instead of placing
# a group every agent would refuse.
NOT_SUPERVISED = (
    "vLLM groups cannot run yet: agents do not supervise a task made of several "
    "processes (the Ray head and vllm serve)"
)


VLLM_ARTIFACT = "vllm"  # a vLLM release's package, by digest


def vllm_release(version: str, digest: str, executable: str = "vllm", ray: str = "ray") -> Release:
    """A vLLM release by its package's bytes: ``digest`` is the vllm package's
    ``engines.package`` digest (``distribution_digest`` where it is installed,
    ``wheel_digest`` of its wheel), so another build of one version is another release."""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"vLLM {version}: {digest!r} is not a sha256 of its package")
    return Release(
        id=f"vllm-{version}-cuda-{digest[:12]}",
        engine="vllm",
        version=version,
        target="cuda",
        artifacts={VLLM_ARTIFACT: digest},
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


def _ray_auth(token: str) -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def plan_vllm(
    release: Release,
    model_path: str,
    served_name: str,
    engine_key: str,
    layout: ParallelLayout,
    tasks: list[ParallelTask],
    ray_token: str,
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
    multi = len(tasks) > 1
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
        env={**_env(head, head), **_ray_auth(ray_token)},
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
            "ray" if multi else "mp",
        ],
        env={
            **_env(head, head),
            "VLLM_API_KEY": engine_key,
            **(_ray_auth(ray_token) if multi else {}),
        },
        base_url=base_url,
    )
    plans["0"] = [ray_head, serve] if multi else [serve]
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
                env={**_env(t, head), **_ray_auth(ray_token)},
                base_url=f"http://{t.address}:{t.port}",
            )
        ]
    return plans
