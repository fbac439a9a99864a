"""A benchmark-sized llama model (about 29 M parameters, random weights), written
with the gguf package like the embedded tiny model, so no hub is needed.

It knows nothing; it is big enough that prompt processing costs real time on
a CPU, which is what prefix caching (and so prefix affinity) saves.
"""

from __future__ import annotations

import itertools
import string
from pathlib import Path

import numpy as np

N_EMBD = 512
N_HEAD = 8
N_FF = 1536
N_LAYER = 8
N_CTX = 4096
SEED = 20261130
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def vocabulary() -> tuple[list[str], list[int]]:
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [_UNKNOWN, _CONTROL, _CONTROL, _CONTROL, _CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [_BYTE] * 256
    pieces = ["▁"] + [chr(c) for c in range(33, 127)]
    pairs = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2)]
    pieces += pairs + ["▁" + p for p in pairs]
    tokens += pieces
    types += [_NORMAL] * len(pieces)
    return tokens, types


def write_bench_model(path: Path) -> Path:
    """Write the model once; an existing file is reused."""
    if path.exists():
        return path
    import gguf

    tokens, types = vocabulary()
    scores = [-float(len(t)) if ty == _NORMAL else 0.0 for t, ty in zip(tokens, types, strict=True)]
    rng = np.random.default_rng(SEED)

    def rand(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("letsinfer-bench-29m")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_eot_token_id(4)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(
        "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + "
        "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{'<|im_start|>assistant\\n'}}{% endif %}"
    )
    n_vocab = len(tokens)
    w.add_tensor("token_embd.weight", rand(n_vocab, N_EMBD, scale=1.0))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", rand(n_vocab, N_EMBD))
    for b in range(N_LAYER):
        w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{b}.{name}.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{b}.ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{b}.ffn_up.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{b}.ffn_down.weight", rand(N_EMBD, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path
