"""Joining the parts of a split GGUF into one file.

The model store keeps one file per model (named by its digest), and llama.cpp
finds the other parts of a split only by their names beside the first. So the
verified parts are joined: the first part's metadata without the ``split.*``
keys, then every part's tensors in order, written tensor by tensor from the
memory-mapped parts (never the whole model in memory).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from letsinfer.bundle.progress import Progress


class SplitError(Exception):
    """The parts do not form one model; the message says which and why."""


def merge_split(parts: Sequence[Path], dest: Path, progress: Progress) -> Path:
    import gguf

    readers = [gguf.GGUFReader(str(p)) for p in parts]
    first = readers[0]
    arch_field = first.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise SplitError(f"{parts[0].name}: no general.architecture")
    count_field = first.get_field(gguf.Keys.Split.LLM_KV_SPLIT_COUNT)
    if count_field is None or int(count_field.contents()) != len(parts):
        raise SplitError(f"{parts[0].name}: its split.count does not say {len(parts)} parts")
    for i, reader in enumerate(readers):
        no = reader.get_field(gguf.Keys.Split.LLM_KV_SPLIT_NO)
        if no is None or int(no.contents()) != i:
            raise SplitError(f"{parts[i].name} is not part {i + 1} of this split")
    tensors = [t for r in readers for t in r.tensors]
    expected = first.get_field(gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
    if expected is not None and int(expected.contents()) != len(tensors):
        raise SplitError(
            f"the parts hold {len(tensors)} tensors, the first part says {int(expected.contents())}"
        )

    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    writer = gguf.GGUFWriter(str(tmp), str(arch_field.contents()), endianess=first.endianess)
    try:
        for field in first.fields.values():
            name = field.name
            if (
                name == gguf.Keys.General.ARCHITECTURE
                or name.startswith("GGUF.")
                or name.startswith("split.")
            ):
                continue
            if name == gguf.Keys.General.ALIGNMENT:
                writer.data_alignment = int(field.contents())
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), kind, sub_type=sub)
        for t in tensors:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        progress.start(f"joining {len(parts)} parts", sum(t.n_bytes for t in tensors))
        try:
            for reader in readers:
                for t in reader.tensors:
                    writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
                    progress.advance(t.n_bytes)
        finally:
            progress.finish()
        writer.close()
        tmp.replace(dest)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return dest
