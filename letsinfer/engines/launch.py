"""Launch plans: the exact command line and environment of one engine task.

A plan is plain data, built from a release and a placement, so it can be
tested without starting anything. Secrets travel in the environment or in a
0600 file, never on the command line (which every local user can read).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from letsinfer.engines.proof import ProofRequest, proof_request
from letsinfer.engines.releases import Release

ENGINE_KEY_ENV = "LETSINFER_ENGINE_KEY"


@dataclass(frozen=True)
class EngineTask:
    """One engine process of a placement group."""

    pg_id: str
    model_name: str
    model_path: Path
    host: str
    port: int
    engine_key: str
    gpu_uuids: tuple[str, ...] = ()
    threads: int = 2
    context: int = 4096
    parallel: int = 4
    embedding: bool = True
    proof: str | None = "completion"  # the request that proves it serves (engines/proof.py)
    # LoRA adapter files, in load order, loaded unapplied (scale 0): a request
    # applies one with llama.cpp's per-request ``lora`` field.
    adapters: tuple[Path, ...] = ()


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    base_url: str
    files: dict[Path, str] = field(default_factory=dict)  # secret files to write (0600)
    proof: ProofRequest | None = None  # asked once healthy, before it counts as ready
    # Whether the process watches its own lease (our launcher does, see
    # engines/lease.py); any other runs under engines/keeper.py.
    own_lease: bool = False

    @property
    def health_url(self) -> str:
        return self.base_url + "/health"


def _device_env(task: EngineTask) -> dict[str, str]:
    # Only the group's own devices are visible; a CPU group sees none.
    return {"CUDA_VISIBLE_DEVICES": ",".join(task.gpu_uuids)}


def plan_llamacpp(release: Release, task: EngineTask, run_dir: Path) -> LaunchPlan:
    """llama.cpp's server, either in-process via xllamacpp or as a binary."""
    base_url = f"http://{task.host}:{task.port}"
    env = {**_device_env(task), ENGINE_KEY_ENV: task.engine_key}
    proof = proof_request(task.proof, task.engine_key) if task.proof else None
    if release.engine == "xllamacpp":
        spec = {
            "model": str(task.model_path),
            "alias": task.model_name,
            "host": task.host,
            "port": task.port,
            "threads": task.threads,
            "n_ctx": task.context * task.parallel,
            "parallel": task.parallel,
            "embedding": task.embedding,
        }
        if task.adapters:
            spec["loras"] = [str(p) for p in task.adapters]
        argv = [sys.executable, "-m", release.launch["module"], json.dumps(spec)]
        return LaunchPlan(argv=argv, env=env, base_url=base_url, proof=proof, own_lease=True)
    if release.engine == "llama-server":
        key_file = run_dir / f"{task.pg_id}.key"
        argv = [
            release.launch["binary"],
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
            "--threads-batch",
            str(task.threads),
            "--ctx-size",
            str(task.context * task.parallel),
            "--parallel",
            str(task.parallel),
            "--api-key-file",
            str(key_file),
            "--slots",
            "--metrics",
        ]
        if task.embedding:
            argv += ["--embeddings", "--pooling", "mean"]
        for adapter in task.adapters:
            # Scale 0: loaded, applied to no request but those that name it.
            argv += ["--lora-scaled", f"{adapter}:0"]
        if task.adapters:
            argv.append("--lora-init-without-apply")
        if task.gpu_uuids:
            argv += ["--n-gpu-layers", "999"]
        return LaunchPlan(
            argv=argv,
            env=_device_env(task),
            base_url=base_url,
            files={key_file: task.engine_key + "\n"},
            proof=proof,
        )
    raise ValueError(f"release {release.id}: engine {release.engine!r} is not a llama.cpp server")
