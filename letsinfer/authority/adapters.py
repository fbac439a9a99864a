"""LoRA adapters: checked against their base model, kept in the model store,
named in the models' namespace.

An adapter is accepted only when its GGUF says it is one (``general.type`` is
``adapter``, ``adapter.type`` is ``lora``), its architecture is the base
model's, and every pair of ``<tensor>.lora_a`` / ``<tensor>.lora_b`` matrices
fits a tensor the base model has: lora_a has the base tensor's rows, lora_b
its columns, and they share their rank (llama.cpp refuses anything else when
it loads the adapter, and then the whole engine fails to start); its
matrices hold float or quantized values, and the header values llama.cpp
reads have the types it asserts (else the engine crashes, at its first
request or at each start). Only the headers are read (memory-mapped): quick
even for large models.

Adding or removing an adapter changes what the base model's engines must
load; they pick it up when they start next (a running node restarts them one
group at a time, see letsinfer.lifecycle.adapters). Until its turn, each
running group keeps the adapters it was launched with (pinned in the same
transaction), so none restarts before then.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from letsinfer.authority.apikeys import keys_naming
from letsinfer.authority.models import audit_target, check_model_name
from letsinfer.authority.modelstore import stage_gguf
from letsinfer.authority.refusals import audited
from letsinfer.contracts.artifacts import ModelFileError, artifact_path
from letsinfer.store import AdapterRecord, AuthorityStore, StoreError

# A node's signed facts list at most this many adapters per engine
# (letsinfer.contracts.facts.PlacementFact.adapters).
MAX_ADAPTERS = 64


class AdapterRefused(StoreError):
    """The file is not a LoRA adapter of that model; nothing changed."""


@dataclass(frozen=True)
class AdapterShape:
    architecture: str
    rank: int
    targets: dict[str, tuple[int, int]]  # base tensor -> (lora_a's ne0, lora_b's ne1)


def _field(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


def _reader(path: Path) -> Any:
    import gguf  # needs numpy: only when a file is checked

    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises many types on a bad file
        raise AdapterRefused(f"{path}: cannot read its GGUF header ({exc})") from exc


# Element types llama.cpp stores but cannot multiply a float activation by:
# an adapter made of them loads, then crashes its engine (SIGSEGV) at the
# first request that applies it, cutting off every request on that engine.
_NOT_MULTIPLIABLE = frozenset({"I8", "I16", "I32", "I64", "F64"})

# Header values llama.cpp reads from an adapter with a type it asserts:
# another type aborts the engine at start, each time it is started.
_TYPED = {
    "adapter.lora.alpha": "FLOAT32",
    "adapter.lora.task_name": "STRING",
    "adapter.lora.prompt_prefix": "STRING",
}


def _check_header_types(reader: Any, path: Path) -> None:
    for key, want in _TYPED.items():
        field = reader.get_field(key)
        if field is None:
            continue
        got = field.types[0].name if field.types else "nothing"
        if got != want:
            raise AdapterRefused(f"{path}: {key} is {got}; llama.cpp reads it as {want}")


def read_adapter(path: Path) -> AdapterShape:
    """What a LoRA adapter file declares, or AdapterRefused saying what it is not."""
    reader = _reader(path)
    kind, lora = _field(reader, "general.type"), _field(reader, "adapter.type")
    if kind != "adapter" or lora != "lora":
        raise AdapterRefused(
            f"{path}: not a LoRA adapter (general.type={kind!r}, adapter.type={lora!r}; "
            "expected 'adapter' and 'lora')"
        )
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise AdapterRefused(f"{path}: no general.architecture")
    _check_header_types(reader, path)
    # The rules are llama.cpp's own (llama-adapter.cpp), so that what is
    # accepted here loads there. Shapes are in ggml's order (ne0 first).
    halves: dict[str, dict[str, list[int]]] = {}
    for t in reader.tensors:
        if t.name.endswith("_norm.weight"):
            continue  # norm vectors: llama.cpp skips them, and the adapter still works
        base, _, half = t.name.rpartition(".")
        if half not in ("lora_a", "lora_b") or not base:
            raise AdapterRefused(f"{path}: tensor {t.name!r} is not a lora_a or lora_b matrix")
        kind = t.tensor_type.name
        if kind in _NOT_MULTIPLIABLE:
            raise AdapterRefused(
                f"{path}: tensor {t.name!r} holds {kind} values; llama.cpp applies only "
                "float (F32, F16, BF16) or quantized ones"
            )
        halves.setdefault(base, {})[half] = [int(n) for n in t.shape]
    if not halves:
        raise AdapterRefused(f"{path}: the adapter has no tensors")
    targets: dict[str, tuple[int, int]] = {}
    ranks = set()
    for base, pair in sorted(halves.items()):
        if set(pair) != {"lora_a", "lora_b"}:
            raise AdapterRefused(f"{path}: {base} has lora_a or lora_b but not both")
        a, b = pair["lora_a"], pair["lora_b"]
        if len(a) != 2 or len(b) != 2:
            raise AdapterRefused(f"{path}: {base}.lora_a {a} or lora_b {b} is not a matrix")
        if base.startswith("token_embd"):
            # Looked up by row, not multiplied: A and B are flipped (the
            # layout llama.cpp's convert_lora_to_gguf.py writes), the rank first in both.
            rank, target = (a[0], b[0]), (b[1], a[1])
        else:
            rank, target = (a[1], b[0]), (a[0], b[1])
        if rank[0] != rank[1]:
            raise AdapterRefused(f"{path}: {base}.lora_a {a} and lora_b {b} do not share a rank")
        ranks.add(rank[0])
        targets[base] = target
    return AdapterShape(arch, max(ranks), targets)


def check_fits(adapter: AdapterShape, base_path: Path, base_name: str) -> None:
    """Refuse an adapter that does not fit the base model's architecture and tensors."""
    reader = _reader(base_path)
    arch = _field(reader, "general.architecture")
    if arch != adapter.architecture:
        raise AdapterRefused(
            f"the adapter is for the {adapter.architecture!r} architecture; "
            f"model {base_name} is {arch!r}"
        )
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    for target, (rows, cols) in adapter.targets.items():
        shape = shapes.get(target)
        if shape is None:
            raise AdapterRefused(f"the adapter changes {target}, which model {base_name} lacks")
        if len(shape) != 2 or shape[0] != rows or shape[1] != cols:
            raise AdapterRefused(
                f"the adapter's {target} is {rows}x{cols}; model {base_name} has it as "
                f"{'x'.join(str(n) for n in shape)}"
            )


def add_adapter(
    store: AuthorityStore,
    model_store: Path,
    base: str,
    name: str,
    source: Path,
    *,
    actor: str = "cli",
    role: str | None = None,
) -> AdapterRecord:
    """Check the file against the base model, store it, record it (audited).
    A refusal is audited and leaves the store and the authority as they were."""
    with audited(store, actor, "model.adapter.add", audit_target(name), role=role):
        check_model_name(name)
        svc = store.resolve_service(base)
        if svc is None:
            raise StoreError(f"no model {base!r} (see `letsinfer model list`)")
        if svc.is_external:
            raise StoreError(f"model {svc.name} is external: its provider serves it, not an engine")
        store.check_name_free(name)
        if len(store.list_adapters(svc.name)) >= MAX_ADAPTERS:
            raise StoreError(
                f"model {svc.name} has {MAX_ADAPTERS} LoRA adapters, the most an engine reports "
                "loading: remove one first"
            )
        try:
            shape = read_adapter(source)
            check_fits(shape, artifact_path(model_store, svc.artifact_digest), svc.name)
            staged = stage_gguf(model_store, source)
        except (AdapterRefused, ModelFileError) as exc:
            raise AdapterRefused(f"adapter {name!r} refused: {exc}. Nothing changed.") from exc
        try:
            with store.transaction():
                store.pin_adapters(svc.name)  # each group restarts in its turn, not at once
                made = store.add_adapter(name, svc.name, staged.digest, staged.size, str(source))
                staged.commit()
                store.append_audit(
                    actor,
                    "model.adapter.add",
                    "ok",
                    role=role,
                    target=name,
                    detail=f"LoRA of {svc.name} (rank {shape.rank}), sha256:{staged.digest}",
                )
        except BaseException:
            staged.discard()
            raise
    return made


def remove_adapter(
    store: AuthorityStore,
    model_store: Path,
    name: str,
    *,
    actor: str = "cli",
    role: str | None = None,
) -> tuple[AdapterRecord, list[str]]:
    """Forget an adapter (audited, a refusal too); its file goes when nothing
    else uses it. With the API keys whose model lists named it."""
    adapter = store.get_adapter(name)
    if adapter is None:
        with audited(store, actor, "model.adapter.remove", audit_target(name), role=role):
            if store.resolve_service(name) is not None:
                raise StoreError(
                    f"{name!r} is a model, not a LoRA adapter (`letsinfer model remove {name}` "
                    "removes a model)"
                )
            raise StoreError(f"no LoRA adapter {name!r} (see `letsinfer model adapter list`)")
    with audited(store, actor, "model.adapter.remove", name, role=role), store.transaction():
        keys = keys_naming(store, {name})
        if keys.stranded:
            raise StoreError(keys.refusal(f"LoRA adapter {name}"))
        store.pin_adapters(adapter.service)  # each group restarts in its turn, not at once
        store.delete_adapter(name)
        keys.apply(store)
        store.append_audit(
            actor,
            "model.adapter.remove",
            "ok",
            role=role,
            target=name,
            detail=f"LoRA of {adapter.service}, sha256:{adapter.artifact_digest}"
            + (
                f"; dropped from the model lists of API keys {', '.join(keys.narrowed)}"
                if keys.narrowed
                else ""
            ),
        )
    free_unused(store, model_store, adapter.artifact_digest)
    return adapter, list(keys.narrowed)


def free_unused(store: AuthorityStore, model_store: Path, digest: str) -> bool:
    """Delete a file of the main's model store that no model or adapter uses."""
    if store.services_using(digest):
        return False
    path = artifact_path(model_store, digest)
    if path.is_file():
        path.unlink()
        return True
    return False


def adapter_rows(store: AuthorityStore, model: str | None) -> list[dict[str, object]]:
    """`model adapter list --json`: the adapters (of ``model`` only, when
    given; StoreError when it names none), on the main and through the admin
    API alike."""
    from datetime import UTC, datetime

    base = None
    if model is not None:
        svc = store.resolve_service(model)
        if svc is None:
            raise StoreError(f"no model {model!r}")
        base = svc.name
    return [
        {
            "name": a.name,
            "model": a.service,
            "sha256": a.artifact_digest,
            "size": a.artifact_size,
            "added": datetime.fromtimestamp(a.created_at, UTC).isoformat(timespec="seconds"),
            "fallback": a.fallback,
        }
        for a in store.list_adapters(base)
    ]
