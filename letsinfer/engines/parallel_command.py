"""The parallel-command runtime: one launcher binary per task, the group in its environment.

A generic parallel runtime for engines that are not vLLM (llama.cpp RPC, a
test engine): every task runs the release's launcher with the same command
line shape; the launcher reads which task it is and where the others are.

- ``--task ID --model PATH --alias NAME --host ADDR --port PORT --threads N
  --ctx-size N --parallel N`` on the command line (nothing secret);
- ``LETSINFER_TASKS``: JSON list of every task, head first:
  ``[{"task": "0", "address": "10.0.0.1", "port": 20000}, ...]``;
- ``LETSINFER_GROUP_KEY``: the group's shared secret, for the tasks to
  authenticate each other (environment, never the command line);
- ``LETSINFER_ENGINE_KEY``: the API key the gateway presents (head only);
- ``CUDA_VISIBLE_DEVICES``: this task's own GPUs only.

Every task answers ``GET /health`` on its port with 200 once it is ready; task
"0" serves the OpenAI API and is the group's endpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from letsinfer.engines.launch import ENGINE_KEY_ENV, EngineTask, LaunchPlan
from letsinfer.engines.releases import Release

TASK_ENV = "LETSINFER_TASK"
TASKS_ENV = "LETSINFER_TASKS"
GROUP_KEY_ENV = "LETSINFER_GROUP_KEY"


@dataclass(frozen=True)
class GroupTask:
    """Where one task of a parallel group runs, as every task is told."""

    task: str
    node_id: str
    address: str  # the node's data address
    port: int
    agent: str  # the node's agent plane, host:port (link proofs)


def plan_parallel_command(
    release: Release, task: EngineTask, task_id: str, group: tuple[GroupTask, ...], group_key: str
) -> LaunchPlan:
    if release.engine != "parallel-command":
        raise ValueError(f"release {release.id} is not a parallel-command runtime")
    if not group or group[0].task != "0":
        raise ValueError("a parallel group needs task 0 (its head) first")
    argv = [
        release.launch["binary"],
        "--task",
        task_id,
        "--model",
        str(task.model_path),
        "--alias",
        task.model_name,
        "--host",
        task.host,
        "--port",
        str(task.port),
        "--threads",
        str(task.threads),
        "--ctx-size",
        str(task.context * task.parallel),
        "--parallel",
        str(task.parallel),
    ]
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(task.gpu_uuids),
        TASK_ENV: task_id,
        TASKS_ENV: json.dumps(
            [{"task": t.task, "address": t.address, "port": t.port} for t in group]
        ),
        GROUP_KEY_ENV: group_key,
    }
    if task_id == "0":
        env[ENGINE_KEY_ENV] = task.engine_key
    return LaunchPlan(argv=argv, env=env, base_url=f"http://{task.host}:{task.port}")
