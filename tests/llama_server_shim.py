"""A stand-in for a CUDA ``llama-server`` binary on a host without a GPU.

It accepts the same command line the agent builds for a real ``llama-server``,
records the environment it was given (so a test can see exactly which GPUs
the engine was shown), then serves with the bundled llama.cpp server.

It fails on purpose, as a broken build would (an error line in llama.cpp's
format, exit 1), when ``LLAMA_SHIM_FAIL`` is set, or while the file named by
``LLAMA_SHIM_FAIL_WHILE`` exists; it takes ``LLAMA_SHIM_SLOW_START`` seconds to
start when that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from letsinfer.engines import llamacpp_launcher
from letsinfer.engines.launch import ENGINE_KEY_ENV


def main() -> int:
    if sys.argv[1:] == ["--version"]:  # as llama-server prints it (on stderr)
        print("version: 0 (shim)\nbuilt with letsinfer's test shim", file=sys.stderr)
        return 0
    ap = argparse.ArgumentParser()
    for flag in (
        "--model",
        "--alias",
        "--host",
        "--port",
        "--threads",
        "--threads-batch",
        "--ctx-size",
        "--parallel",
        "--api-key-file",
        "--pooling",
        "--n-gpu-layers",
    ):
        ap.add_argument(flag)
    for flag in ("--slots", "--metrics", "--embeddings", "--lora-init-without-apply"):
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--lora-scaled", action="append", default=[])
    args = ap.parse_args()
    told = os.environ.get("LLAMA_SHIM_FAIL")
    flag = os.environ.get("LLAMA_SHIM_FAIL_WHILE")
    if told or (flag and Path(flag).exists()):
        print("0.00.000.100 I srv    load_model: loading model", flush=True)
        print(
            f"0.00.000.200 E llama_model_load: error loading model: shim broken on purpose "
            f"({told or flag})",
            flush=True,
        )
        return 1
    slow = os.environ.get("LLAMA_SHIM_SLOW_START")  # a big model or a slow disk
    if slow:
        time.sleep(float(slow))
    record = os.environ.get("LLAMA_SHIM_RECORD")
    if record:
        Path(record).write_text(
            json.dumps(
                {
                    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "n_gpu_layers": args.n_gpu_layers,
                    "argv": sys.argv[1:],
                }
            )
        )
    os.environ[ENGINE_KEY_ENV] = Path(args.api_key_file).read_text().strip()
    spec = {
        "model": args.model,
        "alias": args.alias,
        "host": args.host,
        "port": int(args.port),
        "threads": int(args.threads),
        "n_ctx": int(args.ctx_size),
        "parallel": int(args.parallel),
        "embedding": args.embeddings,
        "loras": [item.rsplit(":", 1)[0] for item in args.lora_scaled],
    }
    return llamacpp_launcher.main(["shim", json.dumps(spec)])


if __name__ == "__main__":
    sys.exit(main())
