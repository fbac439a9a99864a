"""Which GGUF file of a repository a pull means: by name, by quantisation, or the only one.

A split GGUF (``name-00001-of-00003.gguf`` …) is one model in several parts;
it is chosen whole, its parts in order, and refused when a part is missing.
Vision projectors (``mmproj*.gguf``) are never chosen unless named.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_QUANT = re.compile(r"^[A-Za-z0-9_]{1,32}$")


class ChoiceError(Exception):
    """The request does not name exactly one model in the repository; the message lists them."""


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository at a commit, as the hub (or a mirror) lists it."""

    name: str  # path inside the repository
    size: int
    sha256: str  # what the hub publishes (the LFS object id)


@dataclass(frozen=True)
class ModelFiles:
    """One model: a single GGUF file, or every part of a split one, in order."""

    label: str  # the file name, or the split's stem with "-*-of-N.gguf"
    parts: tuple[RepoFile, ...]

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)


def gguf_models(files: Iterable[RepoFile]) -> list[ModelFiles]:
    """Group a listing's GGUF files into models (splits whole); incomplete splits are kept
    with their parts so a request for one can say which part is missing."""
    singles: list[ModelFiles] = []
    splits: dict[tuple[str, int], list[tuple[int, RepoFile]]] = {}
    for f in files:
        if not f.name.lower().endswith(".gguf"):
            continue
        m = _SPLIT.match(f.name)
        if m is None:
            singles.append(ModelFiles(f.name, (f,)))
            continue
        splits.setdefault((m["stem"], int(m["count"])), []).append((int(m["no"]), f))
    for (stem, count), parts in splits.items():
        ordered = tuple(f for _, f in sorted(parts, key=lambda p: p[0]))
        singles.append(ModelFiles(f"{stem}-*-of-{count:05d}.gguf", ordered))
    return sorted(singles, key=lambda m: m.label)


def _complete(model: ModelFiles) -> None:
    m = _SPLIT.match(model.parts[0].name)
    if m is None:
        return
    count = int(m["count"])
    have = {int(mm["no"]) for p in model.parts if (mm := _SPLIT.match(p.name))}
    missing = sorted(set(range(1, count + 1)) - have)
    if missing:
        raise ChoiceError(
            f"{model.label}: part(s) {', '.join(f'{n:05d}' for n in missing)} of {count} "
            "are missing from the repository"
        )


def _is_projector(model: ModelFiles) -> bool:
    return model.parts[0].name.rpartition("/")[2].lower().startswith("mmproj")


def _quant_matches(quant: str, name: str) -> bool:
    # "Q4_K" must not match "Q4_K_M", nor "Q4_XS" match "IQ4_XS".
    pattern = rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])"
    return re.search(pattern, name.rpartition("/")[2], re.IGNORECASE) is not None


def _listing(models: Sequence[ModelFiles]) -> str:
    return ", ".join(m.label for m in models) or "none"


def choose(
    repo: str, files: Iterable[RepoFile], *, file: str | None = None, quant: str | None = None
) -> ModelFiles:
    """The one model ``file`` or ``quant`` names (or the only one there is)."""
    models = gguf_models(files)
    if file is not None:
        found = [m for m in models if any(p.name == file for p in m.parts)]
        if not found:
            raise ChoiceError(f"{repo} has no GGUF file {file!r}; it has: {_listing(models)}")
        chosen = found[0]
    elif quant is not None:
        if not _QUANT.fullmatch(quant):
            raise ChoiceError(f"--quant {quant!r}: expected a quantisation name such as Q4_K_M")
        found = [
            m for m in models if not _is_projector(m) and _quant_matches(quant, m.parts[0].name)
        ]
        if not found:
            raise ChoiceError(
                f"{repo} has no GGUF file for quantisation {quant}; it has: {_listing(models)}"
            )
        if len(found) > 1:
            raise ChoiceError(
                f"{repo} has {len(found)} GGUF files for {quant} ({_listing(found)}); "
                "name one with --file"
            )
        chosen = found[0]
    else:
        candidates = [m for m in models if not _is_projector(m)]
        if not candidates:
            raise ChoiceError(f"{repo} has no GGUF file")
        if len(candidates) > 1:
            raise ChoiceError(
                f"{repo} has {len(candidates)} GGUF models ({_listing(candidates)}); "
                "pick one with --quant or --file"
            )
        chosen = candidates[0]
    _complete(chosen)
    return chosen
