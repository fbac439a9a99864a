"""Run llama.cpp's OpenAI server in this process through xllamacpp.

The agent starts one of these per placement group:
``python -m letsinfer.engines.llamacpp_launcher SPEC_JSON`` with the engine key
in ``LETSINFER_ENGINE_KEY``. It serves until SIGTERM/SIGINT, then exits 0, or
until its agent stops renewing its lease (see engines/lease.py), then exits 3.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from letsinfer.engines.launch import ENGINE_KEY_ENV
from letsinfer.engines.lease import LeaseWatch

LEASE_LOST = 3  # exit status when no agent owns this engine any more


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m letsinfer.engines.llamacpp_launcher SPEC_JSON", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    lease = LeaseWatch.from_environment()
    # Block the stop signals before the server's threads start, so they inherit
    # the mask and only sigwait below sees them.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = spec["model"]
    params.hostnames = [spec["host"]]
    params.port = int(spec["port"])
    params.n_ctx = int(spec["n_ctx"])
    params.n_parallel = int(spec["parallel"])
    params.cpuparams.n_threads = int(spec["threads"])
    params.cpuparams_batch.n_threads = int(spec["threads"])
    params.model_alias = {spec["alias"]}
    params.endpoint_slots = True
    params.endpoint_metrics = True
    if spec.get("embedding"):
        params.embedding = True
        params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    loras = spec.get("loras") or []
    if loras:
        # Scale 0: loaded, applied only to a request that names it in its
        # ``lora`` field (llama.cpp's per-request adapters).
        params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(str(p), 0.0) for p in loras]
        params.lora_init_without_apply = True
    key = os.environ.pop(ENGINE_KEY_ENV, "")
    if key:
        params.api_keys = [key]
    try:
        server = xllamacpp.Server(params)
    except Exception as exc:
        print(f"letsinfer: engine failed to start: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"letsinfer: engine listening on {server.listening_address}", flush=True)
    while signal.sigtimedwait(stop, 1.0) is None:
        if lease.lost():
            print(
                f"letsinfer: no agent renewed this engine's lease for {lease.grace_s:g}s; stopping",
                flush=True,
            )
            del server
            return LEASE_LOST
    print("letsinfer: engine stopping", flush=True)
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
