"""A model's shape, read from its GGUF header: what memory estimates need.

Only the header and the tensor table are read (the file is memory-mapped), so
this is quick even for a model of many gigabytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ShapeError(Exception):
    """The file does not say enough about the model to estimate its memory."""


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    parameters: int
    weights_bytes: int  # the tensors as stored (quantised)
    layers: int
    heads: int
    kv_heads: tuple[int, ...]  # per layer (grouped-query attention)
    embedding: int
    key_length: int  # per head
    value_length: int
    context_length: int  # what it was trained for
    tensor_types: dict[str, int]  # e.g. {"Q8_0": 14, "F32": 5}
    file_type: int | None

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """Keys and values of one token across every layer (f16 cache by default)."""
        return sum(h * (self.key_length + self.value_length) for h in self.kv_heads) * (
            bytes_per_value
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "architecture": self.architecture,
            "parameters": self.parameters,
            "weights_bytes": self.weights_bytes,
            "layers": self.layers,
            "heads": self.heads,
            "kv_heads": max(self.kv_heads) if self.kv_heads else 0,
            "embedding": self.embedding,
            "context_length": self.context_length,
            "tensor_types": self.tensor_types,
        }


def _value(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


def read_shape(path: Path) -> ModelShape:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises many types on a bad file
        raise ShapeError(f"{path.name}: cannot read its GGUF header ({exc})") from exc
    arch = _value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ShapeError(f"{path.name}: no general.architecture")

    def need(key: str) -> int:
        value = _value(reader, f"{arch}.{key}")
        if value is None:
            raise ShapeError(f"{path.name}: no {arch}.{key} in its metadata")
        return int(value if not isinstance(value, list) else max(value))

    layers = need("block_count")
    heads = need("attention.head_count")
    embedding = need("embedding_length")
    raw_kv = _value(reader, f"{arch}.attention.head_count_kv")
    if raw_kv is None:
        kv_heads = (heads,) * layers
    elif isinstance(raw_kv, list):  # per layer
        kv_heads = tuple(int(h) for h in raw_kv)
    else:
        kv_heads = (int(raw_kv),) * layers
    head_dim = embedding // heads if heads else 0
    key_length = int(_value(reader, f"{arch}.attention.key_length") or head_dim)
    value_length = int(_value(reader, f"{arch}.attention.value_length") or head_dim)
    context = int(_value(reader, f"{arch}.context_length") or 0)
    file_type = _value(reader, "general.file_type")
    return ModelShape(
        architecture=arch,
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        weights_bytes=sum(int(t.n_bytes) for t in reader.tensors),
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        embedding=embedding,
        key_length=key_length,
        value_length=value_length,
        context_length=context,
        tensor_types=dict(Counter(t.tensor_type.name for t in reader.tensors)),
        file_type=int(file_type) if file_type is not None else None,
    )
