"""How much memory an engine needs for a model, and whether a node has it.

An estimate with a margin, per engine kind:

- llama.cpp (xllamacpp, llama-server): the weights as stored, plus an f16 KV
  cache for ``context × slots`` tokens (letsinfer starts it with
  ``n_ctx = context × parallel``), plus compute buffers. On GPUs the layers are
  spread over the group's GPUs, each of which also carries a CUDA context.
- vLLM: it takes ``gpu_memory_utilization`` (0.9) of each GPU at start and
  refuses to start when that much is not free; the weights and a KV cache for
  one full sequence of ``context`` tokens must fit inside it.

The numbers are said in every refusal, so an operator can check them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from letsinfer.fit.shape import ModelShape

MiB = 1 << 20
GiB = 1 << 30
# Compute buffers and scratch beyond weights and cache, per device.
_LLAMA_CPP_OVERHEAD = {"cpu": 64 * MiB, "cuda": 320 * MiB}
_VLLM_OVERHEAD = 1 * GiB  # activations, CUDA graphs
VLLM_GPU_UTILIZATION = 0.9
_MARGIN = 0.05  # on top of everything: allocators round up


def size_text(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


@dataclass(frozen=True)
class MemoryNeed:
    engine: str  # "llama.cpp" or "vllm"
    target: str  # cpu, cuda
    weights: int
    kv_cache: int
    overhead: int  # per device
    context: int
    slots: int

    def on(self, devices: int) -> int:
        """Bytes each of ``devices`` devices needs (the model spread evenly)."""
        share = (self.weights + self.kv_cache) / max(devices, 1)
        return int((share + self.overhead) * (1 + _MARGIN))

    def parts(self) -> str:
        return (
            f"weights {size_text(self.weights)} + KV cache {size_text(self.kv_cache)} "
            f"for {self.slots} × {self.context} tokens + overhead {size_text(self.overhead)}"
        )

    def to_json(self, devices: int = 1) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "target": self.target,
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "overhead": self.overhead,
            "context": self.context,
            "slots": self.slots,
            "per_device": self.on(devices),
        }


def engine_family(engine: str) -> str:
    return "vllm" if engine == "vllm" else "llama.cpp"


def estimate(shape: ModelShape, engine: str, target: str, context: int, slots: int) -> MemoryNeed:
    family = engine_family(engine)
    per_token = shape.kv_bytes_per_token()
    if family == "vllm":
        # One full sequence must fit; the model's own limit caps the length.
        length = min(context, shape.context_length) if shape.context_length else context
        return MemoryNeed(
            family, target, shape.weights_bytes, per_token * length, _VLLM_OVERHEAD, length, 1
        )
    return MemoryNeed(
        family,
        target,
        shape.weights_bytes,
        per_token * context * slots,
        _LLAMA_CPP_OVERHEAD.get(target, _LLAMA_CPP_OVERHEAD["cuda"]),
        context,
        slots,
    )


def gpu_refusal(
    need: MemoryNeed, gpus: Sequence[Mapping[str, Any]], devices: int | None = None
) -> str | None:
    """Why these GPUs cannot hold the model, with the numbers; None when they can.
    ``devices``: how many GPUs share the model in all (default: these)."""
    devices = devices or len(gpus)
    per_gpu = need.on(devices)
    short = []
    for g in gpus:
        free = int(g.get("memory_free", 0))
        total = int(g.get("memory_total", free))
        if need.engine == "vllm":
            usable = int(total * VLLM_GPU_UTILIZATION)
            if free < usable:
                short.append(
                    f"{g['uuid']} has {size_text(free)} free, and vLLM takes "
                    f"{VLLM_GPU_UTILIZATION:.0%} of its {size_text(total)} at start"
                )
                continue
            if per_gpu > usable:
                short.append(f"{g['uuid']} offers vLLM {size_text(usable)}")
        elif per_gpu > free:
            short.append(f"{g['uuid']} has {size_text(free)} free")
    if not short:
        return None
    spread = f" per GPU over {devices} GPUs" if devices > 1 else " of GPU memory"
    return f"does not fit: needs {size_text(per_gpu)}{spread} ({need.parts()}); {'; '.join(short)}"


def ram_refusal(need: MemoryNeed, facts: Mapping[str, Any]) -> str | None:
    """Why the node's memory cannot hold the model (cpu target); None when it can."""
    available = facts.get("memory_available")
    if available is None:
        available = facts.get("memory_bytes")
    if available is None:
        return None  # a node that reports no memory: nothing to judge by
    needed = need.on(1)
    if needed <= int(available):
        return None
    return (
        f"does not fit: needs {size_text(needed)} of RAM ({need.parts()}); "
        f"{size_text(int(available))} available"
    )
