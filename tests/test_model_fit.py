"""Which file a pull means, and what a model needs in memory: the rules, without a node."""

from __future__ import annotations

from pathlib import Path

import pytest

from letsinfer.engines.tinymodel import write_tiny_model
from letsinfer.fit.estimate import MiB, estimate, gpu_refusal, ram_refusal
from letsinfer.fit.shape import read_shape
from letsinfer.hub.choice import ChoiceError, RepoFile, choose


def listing(*names: str) -> list[RepoFile]:
    return [RepoFile(n, 10, f"{i:064x}") for i, n in enumerate(names)]


REPO = listing(
    "README.md",
    "m-Q4_K_M.gguf",
    "m-Q4_K.gguf",
    "m-IQ4_XS.gguf",
    "big/m-Q8_0-00002-of-00002.gguf",
    "big/m-Q8_0-00001-of-00002.gguf",
    "mmproj-m-f16.gguf",
)


def test_a_quant_names_one_file_exactly_and_a_split_comes_whole_in_order() -> None:
    assert choose("o/m", REPO, quant="Q4_K").parts[0].name == "m-Q4_K.gguf"
    assert choose("o/m", REPO, quant="q4_k_m").parts[0].name == "m-Q4_K_M.gguf"
    assert [p.name for p in choose("o/m", REPO, quant="Q8_0").parts] == [
        "big/m-Q8_0-00001-of-00002.gguf",
        "big/m-Q8_0-00002-of-00002.gguf",
    ]
    # Naming any part of a split takes the whole split.
    assert len(choose("o/m", REPO, file="big/m-Q8_0-00002-of-00002.gguf").parts) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quant": "Q4_XS"}, "no GGUF file for quantisation Q4_XS"),  # IQ4_XS is another quant
        ({}, "pick one with --quant or --file"),
        ({"file": "m-Q2_K.gguf"}, "has no GGUF file 'm-Q2_K.gguf'"),
        ({"quant": "Q4 K"}, "expected a quantisation name"),
    ],
)
def test_a_request_that_names_no_single_model_is_refused_with_the_choices(
    kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(ChoiceError, match=message):
        choose("o/m", REPO, **kwargs)


def test_a_split_with_a_missing_part_is_refused() -> None:
    with pytest.raises(ChoiceError, match="part\\(s\\) 00002 of 3 are missing"):
        choose("o/m", listing("m-00001-of-00003.gguf", "m-00003-of-00003.gguf"))


def test_memory_need_counts_weights_kv_cache_and_overhead(tmp_path: Path) -> None:
    shape = read_shape(write_tiny_model(tmp_path / "t.gguf", "Q8_0"))
    assert (shape.layers, shape.heads, shape.kv_heads, shape.embedding) == (2, 4, (4, 4), 64)
    assert shape.context_length == 2048 and shape.tensor_types["Q8_0"] > 0
    # f16 keys and values: 2 layers × 4 heads × (16 + 16) × 2 bytes per token.
    assert shape.kv_bytes_per_token() == 512
    need = estimate(shape, "xllamacpp", "cpu", context=4096, slots=4)
    assert need.kv_cache == 512 * 4096 * 4
    assert need.weights == shape.weights_bytes

    gpu = {"uuid": "GPU-a", "memory_total": 8 << 30, "memory_free": 16 * MiB}
    refusal = gpu_refusal(estimate(shape, "llama-server", "cuda", 4096, 4), [gpu])
    assert refusal is not None and "GPU-a has 16.0 MiB free" in refusal
    assert gpu_refusal(need, [{**gpu, "memory_free": 4 << 30}]) is None
    # vLLM takes 90% of the GPU at start: a GPU with less free is refused.
    vllm = estimate(shape, "vllm", "cuda", 4096, 4)
    assert vllm.context == 2048  # one sequence, capped at what the model was trained for
    half_free = {**gpu, "memory_free": 4 << 30}
    assert "vLLM takes 90%" in (gpu_refusal(vllm, [half_free]) or "")
    assert ram_refusal(need, {"memory_available": 64 * MiB}) is not None
    assert ram_refusal(need, {"memory_available": 1 << 30}) is None
