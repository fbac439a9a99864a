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

from letsinfer.engines.tinymodel import spm_vocabulary, write_llama_gguf

N_EMBD = 512
N_HEAD = 8
N_FF = 1536
N_LAYER = 8
N_CTX = 4096
SEED = 20261130


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    # Every two-letter piece, bare and with a leading space: prompts tokenize
    # into many realistic-sized tokens.
    pairs = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2)]
    return spm_vocabulary(pairs + ["▁" + p for p in pairs])


def write_bench_model(path: Path) -> Path:
    """Write the model once; an existing file is reused."""
    if path.exists():
        return path
    vocab = vocabulary()
    rng = np.random.default_rng(SEED)
    n_vocab = len(vocab[0])
    embd = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    output = (rng.standard_normal((n_vocab, N_EMBD)) * 0.02).astype(np.float32)
    return write_llama_gguf(
        path,
        "letsinfer-bench-29m",
        n_ctx=N_CTX,
        n_ff=N_FF,
        n_head=N_HEAD,
        n_layer=N_LAYER,
        vocab=vocab,
        token_embd=embd,
        output=output,
        rng=rng,
    )
