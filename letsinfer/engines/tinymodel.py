"""The embedded default model: a tiny GGUF generated on the spot.

No registry ships trained weights and the first run must need no hub, so the
node writes a ~0.5 MB llama-architecture model whose output is fixed by
construction: every chat answer is :data:`SENTENCE`, then end-of-sequence.
The block weights are small and random, so every layer of the real engine
really computes; the answer is decided by the embedding/output geometry alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: What the tiny model answers to any chat prompt, at any temperature.
SENTENCE = "Hello from letsinfer, a tiny model served by llama.cpp!"
# The sentence as whole-word pieces ("▁" marks a leading space). Each piece is
# unique so that "the last piece decides the next" is a function.
_SENTENCE_PIECES = [
    "Hello",
    "▁from",
    "▁letsinfer",
    ",",
    "▁a",
    "▁tiny",
    "▁model",
    "▁served",
    "▁by",
    "▁llama",
    ".",
    "cpp",
    "!",
]
assert "".join(_SENTENCE_PIECES).replace("▁", " ") == SENTENCE

DEFAULT_NAME = "tiny"

_N_EMBD = 64
_N_HEAD = 4
_N_FF = 128
_N_LAYER = 2
_N_CTX = 2048
_MARGIN = 40.0  # logit lead of the intended token: decisive at any temperature
_SEED = 20261129

_CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# SentencePiece token types as llama.cpp reads them.
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def spm_vocabulary(pieces: list[str]) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: control tokens (ChatML), 256 byte
    tokens, printable characters, then ``pieces``; shorter pieces score higher."""
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [_UNKNOWN, _CONTROL, _CONTROL, _CONTROL, _CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [_BYTE] * 256
    for piece in ["▁"] + [chr(c) for c in range(33, 127)] + pieces:
        if piece not in tokens:
            tokens.append(piece)
            types.append(_NORMAL)
    scores = [-float(len(t)) if ty == _NORMAL else 0.0 for t, ty in zip(tokens, types, strict=True)]
    return tokens, scores, types


def write_llama_gguf(
    path: Path,
    name: str,
    *,
    n_ctx: int,
    n_ff: int,
    n_head: int,
    n_layer: int,
    vocab: tuple[list[str], list[float], list[int]],
    token_embd: np.ndarray,
    output: np.ndarray,
    rng: np.random.Generator,
    weights: str = "F32",
    split_max_tensors: int = 0,
    architecture: str = "llama",
) -> Path:
    """A llama-architecture GGUF with a ChatML template; the blocks get small
    random weights (every layer really computes). Written atomically.

    ``weights`` stores the weight matrices as F32, F16 or Q8_0 (norms stay F32);
    ``split_max_tensors`` > 0 writes a split GGUF (``NAME-00001-of-0000N.gguf``
    beside ``path``) and returns its first part."""
    import gguf  # only needed when a model is generated

    tokens, scores, types = vocab
    n_embd = token_embd.shape[1]
    file_types = {
        "F32": gguf.LlamaFileType.ALL_F32,
        "F16": gguf.LlamaFileType.MOSTLY_F16,
        "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }
    if weights not in file_types:
        raise ValueError(f"weights {weights!r}: expected one of {', '.join(file_types)}")

    def small(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    split = split_max_tensors > 0
    tmp_dir = path.parent / f".{path.name}.tmp"
    tmp = tmp_dir / path.name if split else path.with_suffix(path.suffix + ".part")
    if split:
        tmp_dir.mkdir(exist_ok=True)
    # Another architecture name makes a file llama.cpp refuses to load (tests).
    writer = gguf.GGUFWriter(str(tmp), architecture, split_max_tensors=split_max_tensors)
    add_tensor = writer.add_tensor

    def add_matrix(name: str, data: np.ndarray) -> None:
        if weights == "F16":
            add_tensor(name, data.astype(np.float16))
        elif weights == "Q8_0":
            q8 = gguf.GGMLQuantizationType.Q8_0
            add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)
        else:
            add_tensor(name, data)

    writer.add_name(name)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(file_types[weights])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_eot_token_id(4)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(_CHATML)
    add_matrix("token_embd.weight", token_embd)
    add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    add_matrix("output.weight", output)
    for b in range(n_layer):
        add_tensor(f"blk.{b}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            add_matrix(f"blk.{b}.{part}.weight", small(n_embd, n_embd))
        add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        add_matrix(f"blk.{b}.ffn_gate.weight", small(n_ff, n_embd))
        add_matrix(f"blk.{b}.ffn_up.weight", small(n_ff, n_embd))
        add_matrix(f"blk.{b}.ffn_down.weight", small(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if not split:
        tmp.replace(path)
        return path
    parts = sorted(tmp_dir.iterdir())
    for part in parts:
        part.replace(path.parent / part.name)
    tmp_dir.rmdir()
    return path.parent / parts[0].name


def write_tiny_model(
    path: Path,
    weights: str = "F32",
    split_max_tensors: int = 0,
    architecture: str = "llama",
    name: str = "letsinfer-tiny",
    words: int | None = None,
) -> Path:
    """Write the deterministic tiny model to ``path`` (same bytes every time).

    ``weights`` F16 or Q8_0 makes the same model at another quantisation;
    ``split_max_tensors`` makes it a split GGUF (see :func:`write_llama_gguf`);
    under another ``architecture`` name, a well-formed GGUF no engine loads
    (tests); another ``name`` gives other bytes that serve the same; ``words``
    makes a model that answers only the sentence's first pieces (tests: other
    weights that answer worse)."""
    tokens, scores, types = spm_vocabulary(_SENTENCE_PIECES)
    n_vocab = len(tokens)
    rng = np.random.default_rng(_SEED)
    scale = float(np.sqrt(_N_EMBD))  # a one-hot direction scaled to unit RMS

    # Direction 0 is shared by every token outside the sentence; piece k owns
    # direction k + 1.
    piece_ids = [tokens.index(p) for p in _SENTENCE_PIECES]
    embd = np.zeros((n_vocab, _N_EMBD), dtype=np.float32)
    embd[:, 0] = scale
    for k, tid in enumerate(piece_ids):
        embd[tid, :] = 0.0
        embd[tid, k + 1] = scale

    output = np.zeros((n_vocab, _N_EMBD), dtype=np.float32)
    output[piece_ids[0], 0] = _MARGIN / scale
    last = len(piece_ids) if words is None else max(1, min(words, len(piece_ids)))
    for k in range(last - 1):
        output[piece_ids[k + 1], k + 1] = _MARGIN / scale
    output[2, last] = _MARGIN / scale  # last piece -> </s>

    return write_llama_gguf(
        path,
        name,
        n_ctx=_N_CTX,
        n_ff=_N_FF,
        n_head=_N_HEAD,
        n_layer=_N_LAYER,
        vocab=(tokens, scores, types),
        token_embd=embd,
        output=output,
        rng=rng,
        weights=weights,
        split_max_tensors=split_max_tensors,
        architecture=architecture,
    )


#: What the tiny model answers with :func:`write_tiny_lora` applied: the
#: sentence from its sixth word on (with the space before it).
LORA_SENTENCE = " tiny model served by llama.cpp!"


def write_tiny_lora(
    path: Path, *, rows: int | None = None, architecture: str = "llama", inert: bool = False
) -> Path:
    """A real LoRA adapter (GGUF, rank 1) for the tiny model: it changes only
    ``output.weight`` so that the default direction scores the sentence's
    sixth piece above its first, and the answer becomes :data:`LORA_SENTENCE`.

    ``rows`` other than the tiny model's vocabulary, or another
    ``architecture``, make an adapter that does not fit it; ``inert``, one
    that fits and changes nothing (tests)."""
    import gguf  # only needed when an adapter is written

    tokens, _, _ = spm_vocabulary(_SENTENCE_PIECES)
    n_vocab = rows or len(tokens)
    scale = float(np.sqrt(_N_EMBD))
    lora_a = np.zeros((1, _N_EMBD), dtype=np.float32)  # reads the default direction
    lora_a[0, 0] = 1.0
    lora_b = np.zeros((n_vocab, 1), dtype=np.float32)
    if not inert:
        lora_b[tokens.index("▁tiny") % n_vocab, 0] = 2 * _MARGIN / scale  # outscores "Hello"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".part")
    writer = gguf.GGUFWriter(str(tmp), architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 1.0)  # alpha / rank = 1: applied as written
    writer.add_name("letsinfer-tiny-lora")
    writer.add_tensor("output.weight.lora_a", lora_a)
    writer.add_tensor("output.weight.lora_b", lora_b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path
